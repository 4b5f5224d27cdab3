"""Data kinds: how the raw_dataset and shards assets handle images and text.

Tables keep their own path (assets/ingest.py, assets/sharding.py: chunked Great Expectations
suites, shard format v1). Image folders and text corpora go through a ``DataKind``:

- ``ingest`` validates the source files chunk by chunk (bounded memory) and writes the raw copy
  that ``raw_dataset`` commits (``datasets/<name>/raw/<raw_name>``), with a ``QualityReport``
  of its checks (Great Expectations where it fits, plain checks reported the same way);
- ``shard`` turns that copy into typed-column shards (format v2, training_runtime/data/shard_format.py)
  under ``out_dir`` and returns their manifest;
- ``check_shards`` validates the shards written (counts, fractions, labels, checksums, and what
  the kind knows about its samples).

A failed check keeps the evidence on the run branch; nothing reaches main.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from assets.kinds.base import RawData
from core.spec import ImageFolder, PipelineSpec, TextCorpus

if TYPE_CHECKING:  # the image pool's workers import this package: they need neither GE's reports nor pandas
    from assets.quality import QualityReport

__all__ = ["DataKind", "RawData", "data_kind"]


class DataKind(Protocol):
    raw_name: str  # file name of the raw copy under datasets/<name>/raw/

    def ingest(self, spec: PipelineSpec, files: list[Path], root: Path, out: Path) -> RawData:
        """Validate ``files`` (all under ``root``) and write the accepted samples to ``out``."""

    def shard(self, spec: PipelineSpec, raw_file: Path, out_dir: Path) -> dict:
        """Preprocess the raw copy into v2 shards under ``out_dir``; return the manifest."""

    def check_shards(self, spec: PipelineSpec, manifest: dict, out_dir: Path) -> QualityReport:
        """Validate the shards just written under ``out_dir``."""


def data_kind(spec: PipelineSpec) -> DataKind | None:
    """The kind of ``spec``'s source; None for tables, which keep their own path."""
    if isinstance(spec.source, ImageFolder):
        from assets.kinds.images import IMAGES

        return IMAGES
    if isinstance(spec.source, TextCorpus):
        from assets.kinds.text import TEXT

        return TEXT
    return None
