"""Ingest an image folder: find and label every file, check it, and write the raw copy.

Labels come from class sub-folders (``root/<class>/<file>``) or from a manifest (CSV/Parquet in
root) of relative paths and labels. Every file is checked; what is wrong is reported with the
file's path under the sources root and the problem, and the run stops before main. Images are
read ``files_per_chunk`` at a time, decoded in full on the worker pool (a truncated or corrupt
file is found here), and appended to the raw copy one Parquet row group per chunk, in id order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from PIL import Image

from assets.kinds.base import RawData
from assets.kinds.image_decode import FORMAT_OF_EXTENSION, ImageInfo
from assets.kinds.image_listing import Entry, Problems, list_entries
from assets.kinds.image_pool import WorkerPool, inspect_task, task_size
from assets.quality.chunked import ChunkedRawSuite
from assets.quality.runner import ExpectationOutcome, QualityReport
from core.spec import ImageFolder, PipelineSpec

RAW_NAME = "images.parquet"
RAW_COLUMNS = ("id", "label", "width", "height", "mode", "format", "sha256", "bytes")


def image_suite(spec: PipelineSpec) -> dict[str, list]:
    """Great Expectations on the per-image table (``rows``: id, label, width, height, mode, format)
    and on the class counts (``classes``: label, count, share)."""
    import great_expectations as gx

    E = gx.expectations
    src: ImageFolder = spec.source
    formats = sorted({FORMAT_OF_EXTENSION[e.lower()] for e in src.extensions if e.lower() in FORMAT_OF_EXTENSION})
    classes = list(spec.class_names)
    rows = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectColumnValuesToBeUnique(column="id"),
        E.ExpectColumnValuesToNotBeNull(column="label"),
        E.ExpectColumnValuesToBeInSet(column="label", value_set=classes),
        E.ExpectColumnValuesToBeBetween(column="width", min_value=src.min_side, max_value=src.max_side),
        E.ExpectColumnValuesToBeBetween(column="height", min_value=src.min_side, max_value=src.max_side),
        E.ExpectColumnValuesToBeInSet(column="mode", value_set=list(src.modes)),
        E.ExpectColumnValuesToBeInSet(column="format", value_set=formats),
    ]
    return {"rows": rows, "classes": [E.ExpectColumnDistinctValuesToEqualSet(column="label", value_set=classes)]}


class RawImageWriter:
    """The raw copy: one row per accepted image, the original bytes in a binary column. The bytes
    are stored uncompressed (they are compressed images) and without statistics (a min/max of
    whole images would bloat the footer); the footer stays small however many row groups."""

    def __init__(self, path: Path):
        import pyarrow as pa

        self.path, self._writer = path, None
        self.schema = pa.schema([("id", pa.string()), ("label", pa.string()), ("width", pa.int32()),
                                 ("height", pa.int32()), ("mode", pa.string()), ("format", pa.string()),
                                 ("sha256", pa.string()), ("bytes", pa.large_binary())])

    def append(self, rows: list[tuple[Entry, ImageInfo, bytes]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not rows:
            return
        if self._writer is None:
            small = [c for c in RAW_COLUMNS if c != "bytes"]
            self._writer = pq.ParquetWriter(
                self.path, self.schema, compression={**{c: "zstd" for c in small}, "bytes": "none"},
                use_dictionary=["label", "mode", "format"], write_statistics=small)
        table = pa.Table.from_pydict({
            "id": [e.id for e, _, _ in rows], "label": [e.label for e, _, _ in rows],
            "width": [i.width for _, i, _ in rows], "height": [i.height for _, i, _ in rows],
            "mode": [i.mode for _, i, _ in rows], "format": [i.format for _, i, _ in rows],
            "sha256": [i.sha256 for _, i, _ in rows], "bytes": [b for _, _, b in rows]}, schema=self.schema)
        self._writer.write_table(table, row_group_size=len(rows))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


@dataclass
class _Chunk:
    """Images of one chunk as they come back from the pool."""

    index: int
    rows: list[tuple[Entry, ImageInfo | None, str | None, bytes]]


def ingest_images(spec: PipelineSpec, files: list[Path], root: Path, out: Path,
                  workers: int | None = None) -> RawData:
    src: ImageFolder = spec.source
    problems = Problems(src.root)
    sources: dict[str, dict] = {}
    entries = sorted(list_entries(spec, files, root, problems, sources), key=lambda e: e.id)
    suite = ChunkedRawSuite(f"{spec.name}/raw_dataset", image_suite(spec), (), "label")
    writer = RawImageWriter(out)
    accepted = 0
    try:
        with WorkerPool(workers) as pool:
            for chunk in _inspected_chunks(pool, entries, src.files_per_chunk, problems):
                if not chunk.rows:
                    continue
                frame, keep = _check_chunk(src, chunk, problems, sources)
                suite.add(frame)
                writer.append(keep)
                accepted += len(keep)
    finally:
        writer.close()
    report = suite.finish()
    report.outcomes.append(_class_shares(suite))
    failures = problems.messages()
    if not entries and not failures:
        failures.append(f"{src.root}: no images found in the image folder")
    report = QualityReport(report.asset, report.outcomes, failures)
    return RawData(path=out, rows=accepted, report=report,
                   sources=[sources[k] for k in sorted(sources)])


def _inspected_chunks(pool: WorkerPool, entries: list[Entry], per_chunk: int,
                      problems: Problems) -> Iterator[_Chunk]:
    """Chunks of ``entries`` with each image's (info, problem), checked on the pool; files that
    cannot be read or are empty are reported here and never sent."""
    limit = Image.MAX_IMAGE_PIXELS  # the caller's bomb limit travels with each task

    def jobs():
        for index, start in enumerate(range(0, len(entries), per_chunk)):
            readable = []
            for entry in entries[start:start + per_chunk]:
                content = _read(entry, problems)
                if content is not None:
                    readable.append((entry, content))
            step = task_size(len(readable), pool.workers)
            for s in range(0, len(readable), step):
                part = readable[s:s + step]
                yield (index, part), ([c for _, c in part], [e.extension for e, _ in part], limit)

    current = _Chunk(0, [])
    for (index, part), results in pool.ordered(inspect_task, jobs()):
        if index != current.index:
            yield current
            current = _Chunk(index, [])
        current.rows += [(entry, info, problem, content) for (entry, content), (info, problem) in zip(part, results)]
    yield current


def _read(entry: Entry, problems: Problems) -> bytes | None:
    try:
        content = entry.path.read_bytes()
    except OSError as exc:
        problems.file(entry.id, f"cannot be read: {type(exc).__name__}: {exc}")
        return None
    if not content:
        problems.file(entry.id, "is empty (0 bytes)")
        return None
    return content


def _check_chunk(src: ImageFolder, chunk: _Chunk, problems: Problems,
                 sources: dict[str, dict]) -> tuple[pd.DataFrame, list[tuple[Entry, ImageInfo, bytes]]]:
    """The chunk's per-image table for the suite, and the images accepted into the raw copy."""
    table, keep = [], []
    for entry, info, problem, content in chunk.rows:
        if problem is not None:
            problems.file(entry.id, problem)
            continue
        sources[entry.source_key]["sha256"] = info.sha256
        table.append({"id": entry.id, "label": entry.label, "width": info.width, "height": info.height,
                      "mode": info.mode, "format": info.format})
        found = _size_and_mode_problems(src, info)
        for p in found:
            problems.file(entry.id, p)
        if not found and entry.label_ok:
            keep.append((entry, info, content))
    columns = ["id", "label", "width", "height", "mode", "format"]
    return pd.DataFrame(table, columns=columns), keep


def _size_and_mode_problems(src: ImageFolder, info: ImageInfo) -> list[str]:
    found = []
    if min(info.width, info.height) < src.min_side:
        found.append(f"is {info.width}x{info.height} pixels, smaller than min_side {src.min_side}")
    if max(info.width, info.height) > src.max_side:
        found.append(f"is {info.width}x{info.height} pixels, larger than max_side {src.max_side}")
    if info.mode not in src.modes:
        found.append(f"has mode {info.mode!r}, not one of the accepted modes {list(src.modes)}")
    return found


def _class_shares(suite: ChunkedRawSuite) -> ExpectationOutcome:
    """Each class's share of the accepted images, for the report (informational: always passes)."""
    total = max(1, suite.rows)
    shares = {str(label): round(int(n) / total, 6) for label, n in suite.counts.sort_index().items()}
    return ExpectationOutcome(table="classes", expectation="class_shares", kwargs={}, success=True, observed=shares)

