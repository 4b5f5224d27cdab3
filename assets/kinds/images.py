"""Image folders as a ``DataKind``: JPEG/PNG/WebP files in class folders (or listed by a manifest)
become a checked raw copy, then typed-column shards of preprocessed images.

The work is split by stage:

- ``image_listing``: which files are images, and their labels (class folders or manifest);
- ``image_decode``: one image checked (format, size, mode, a full decode) or preprocessed;
- ``image_pool``: the process pool that runs those on every core, in order;
- ``image_parts``: the parts the folder is kept in, so that a new version costs what changed;
- ``image_ingest``: the raw copy, part by part (``images/<part>.parquet``: id, label, width,
  height, mode, format, sha256 and the original bytes; ``parts.json`` lists the parts) with its
  Great Expectations report, in three stages (plan, ingest groups of parts, finish) that one
  process runs in turn or Dagster steps share (assets/image_ingest_steps.py);
- ``image_store``: what a new version's commit adds, keeps and removes;
- ``image_shards`` / ``image_checks``: the shards (``image`` uint8 (h, w, c) or ``jpeg`` bytes,
  ``label`` int64, ``id`` str), their manifest, and their checks.
"""

from __future__ import annotations

from pathlib import Path

from assets.kinds.base import RawData
from assets.kinds.image_checks import check_image_shards
from assets.kinds.image_ingest import (
    RAW_COLUMNS,
    RAW_NAME,
    IngestPlan,
    NewPart,
    finish_ingest,
    ingest_images,
    ingest_parts,
    plan_ingest,
)
from assets.kinds.image_pool import preprocess_images
from assets.kinds.image_shards import shard_images
from assets.quality.runner import QualityReport
from core.spec import PipelineSpec

__all__ = ["IMAGES", "ImageKind", "RAW_COLUMNS", "preprocess_images"]


class ImageKind:
    """``workers``: processes that decode and preprocess (None: one per core)."""

    raw_name = RAW_NAME
    in_parts = True  # raw copy and shards kept per part (assets/kinds/image_parts.py)

    def __init__(self, workers: int | None = None):
        self.workers = workers

    def ingest(self, spec: PipelineSpec, files: list[Path], root: Path, out: Path, **build_on) -> RawData:
        """``out`` is a directory; ``build_on``: ``salt``, ``hashes``, ``previous`` (``ingest_images``)."""
        return ingest_images(spec, files, root, out, self.workers, **build_on)

    def plan_ingest(self, spec: PipelineSpec, files: list[Path], root: Path, **build_on) -> IngestPlan:
        """What an ingest over steps decides before decoding (``plan_ingest``)."""
        return plan_ingest(spec, files, root, **build_on)

    def finish_ingest(self, spec: PipelineSpec, plan: IngestPlan, made: list[dict], out: Path, rows_table) -> RawData:
        """The index and the report of an ingest over steps (``finish_ingest``)."""
        return finish_ingest(spec, plan, made, out, rows_table)

    def ingest_parts(self, spec: PipelineSpec, parts: list[NewPart], out: Path) -> dict:
        """One ingest step's share: ``parts`` decoded, checked and written under ``out`` (``ingest_parts``)."""
        return ingest_parts(spec, parts, out, self.workers)

    def shard(self, spec: PipelineSpec, raw_dir: Path, out_dir: Path, previous: dict | None = None) -> dict:
        return shard_images(spec, raw_dir, out_dir, self.workers, previous)

    def check_shards(self, spec: PipelineSpec, manifest: dict, out_dir: Path) -> QualityReport:
        return check_image_shards(spec, manifest, out_dir)


IMAGES = ImageKind()
