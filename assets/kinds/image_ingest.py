"""Ingest an image folder: find and label every file, check it, and write the raw copy, part by part.

Labels come from class sub-folders (``root/<class>/<file>``) or from a manifest (CSV/Parquet in
root) of relative paths and labels. Every file is checked; what is wrong is reported with the
file's path under the sources root and the problem, and the run stops before main. Images are
read ``files_per_chunk`` at a time, decoded in full on the worker pool (a truncated or corrupt
file is found here), and appended to their part's raw copy one Parquet row group per chunk, in
id order. The parts (assets/kinds/image_parts.py) that the previous version already holds are not
read again: their checked rows come from that version.

The work is in three stages, so that Dagster steps can share it (assets/image_ingest_steps.py)
and one process runs them in turn (``ingest_images``): ``plan_ingest`` lists, hashes and cuts
the parts, deciding which the previous version holds; ``ingest_parts`` decodes, checks and writes
any group of the new parts; ``finish_ingest`` writes the index and judges every row of the version
with the suite. The report and files do not depend on how the new parts were grouped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from PIL import Image

from assets.kinds.base import RawData
from assets.kinds.image_decode import FORMAT_OF_EXTENSION, ImageInfo
from assets.kinds.image_listing import Entry, Problems, StoreListing, list_entries
from assets.kinds.image_parts import INDEX_NAME, index, intact, raw_part_path, rows_part_path, split_into_parts
from assets.kinds.image_pool import WorkerPool, inspect_task, task_size, workers_for
from assets.quality.chunked import ChunkedRawSuite
from assets.quality.runner import ExpectationOutcome, QualityReport
from assets.source import file_sha256
from core.spec import ImageFolder, PipelineSpec

RAW_NAME = INDEX_NAME  # raw/parts.json; the parts lie beside it (assets/kinds/image_parts.py)
RAW_COLUMNS = ("id", "label", "width", "height", "mode", "format", "sha256", "bytes")
_SUITE_COLUMNS = ("id", "label", "width", "height", "mode", "format")  # the suite's ``rows`` table


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

    def __init__(self, path: Path, with_bytes: bool = True):
        import pyarrow as pa

        self.path, self.with_bytes, self._writer = path, with_bytes, None
        fields = [("id", pa.string()), ("label", pa.string()), ("width", pa.int32()), ("height", pa.int32()),
                  ("mode", pa.string()), ("format", pa.string()), ("sha256", pa.string())]
        self.schema = pa.schema(fields + ([("bytes", pa.large_binary())] if with_bytes else []))

    def append(self, rows: list[tuple[Entry, ImageInfo, bytes]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not rows:
            return
        if self._writer is None:
            small = [c for c in RAW_COLUMNS if c != "bytes"]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(
                self.path, self.schema, compression={**{c: "zstd" for c in small}, "bytes": "none"},
                use_dictionary=["label", "mode", "format"], write_statistics=small)
        columns = {
            "id": [e.id for e, _, _ in rows], "label": [e.label for e, _, _ in rows],
            "width": [i.width for _, i, _ in rows], "height": [i.height for _, i, _ in rows],
            "mode": [i.mode for _, i, _ in rows], "format": [i.format for _, i, _ in rows],
            "sha256": [i.sha256 for _, i, _ in rows]}
        if self.with_bytes:
            columns["bytes"] = [b for _, _, b in rows]
        table = pa.Table.from_pydict(columns, schema=self.schema)
        self._writer.write_table(table, row_group_size=len(rows))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


@dataclass
class _Chunk:
    """Images of one chunk as they come back from the pool; ``part`` is the index of its part."""

    part: int
    rows: list[tuple[Entry, ImageInfo | None, str | None, bytes]]


@dataclass(frozen=True)
class PreviousParts:
    """The parts of the version a run builds on (the newest published one, when its parameters
    and code equal the run's): ``parts`` by key, as its index lists them, and ``rows(part)``, which
    brings that part's rows table (``image-rows/<name>.parquet``) here and gives its path."""

    parts: dict[str, dict]
    rows: Callable[[dict], Path]


@dataclass(frozen=True)
class NewPart:
    """A part no kept part holds, to be read and checked: its record in the index (less the rows
    accepted, known once checked) and its ``entries`` in id order (empty once planned: the plan
    that the publish step reads does not carry the file list twice)."""

    record: dict
    entries: tuple[Entry, ...] = ()


@dataclass(frozen=True)
class IngestPlan:
    """Everything decided before an image is decoded: what the listing found wrong (``problems``,
    ``count``), each file's description (``sources``), the previous version's parts kept (their
    records, in its index's order) and the new parts, in id order."""

    problems: list[str]
    count: int
    sources: dict[str, dict]
    kept: list[dict]
    new: list[NewPart]
    salt: str
    target: int

    def without_entries(self) -> "IngestPlan":
        return dataclasses.replace(self, new=[NewPart(p.record) for p in self.new])


def plan_ingest(spec: PipelineSpec, files: list[Path] | StoreListing, root: Path, *, salt: str = "",
                hashes: Mapping[str, str] | None = None, previous: PreviousParts | None = None) -> IngestPlan:
    """List and label the files, hash them (``hashes``: the sha256 the data key has read, by path
    under ``root``), keep the parts of ``previous`` whose images are all still there, unchanged, and
    cut the other images into new parts. Nothing is decoded here. ``files``: local files, or the
    store's listing, whose images are not downloaded here (``hashes`` must then name each)."""
    src: ImageFolder = spec.source
    problems = Problems(src.root)
    sources: dict[str, dict] = {}
    entries = sorted(list_entries(spec, files, root, problems, sources), key=lambda e: e.id)
    digests = [(hashes or {}).get(e.source_key) or file_sha256(e.path) for e in entries]
    members = [(e.id, e.label, d) for e, d in zip(entries, digests)]
    current = {m[0]: m for m in members}
    kept: list[dict] = []
    claimed: set[str] = set()
    for record in (previous.parts.values() if previous else ()):  # one rows table at a time
        table = previous.rows(record)
        frame = pd.read_parquet(table, columns=["id", "label", "sha256"])
        table.unlink()
        if intact(record["key"], list(zip(frame["id"], frame["label"], frame["sha256"])), current, salt):
            claimed.update(frame["id"])
            kept.append({**record, "reused": True})
    by_id = {e.id: (e, d) for e, d in zip(entries, digests)}
    for image_id in claimed:
        entry, digest = by_id[image_id]
        sources[entry.source_key]["sha256"] = digest
    entries = [e for e in entries if e.id not in claimed]  # what no kept part holds: read and checked now
    new = [NewPart({"key": part.key, "name": part.name, "images": part.stop - part.start,
                    "first_id": entries[part.start].id, "last_id": entries[part.stop - 1].id,
                    "raw": raw_part_path(part.name), "rows_table": rows_part_path(part.name), "reused": False},
                   tuple(entries[part.start:part.stop]))
           for part in split_into_parts([current[e.id] for e in entries], src.files_per_part, salt)]
    messages, count = problems.found()
    return IngestPlan(messages, count, sources, kept, new, salt, src.files_per_part)


def ingest_parts(spec: PipelineSpec, parts: Sequence[NewPart], out: Path, workers: int | None = None) -> dict:
    """Decode and check every image of ``parts`` on the worker pool and write each part's raw copy
    and rows table under ``out`` (a part with no accepted image has neither). Returns what the
    publish step needs of them: per part (by key) the images ``accepted`` and the ``rejected`` ones'
    rows for the suite (decoded, but of a wrong size, mode or label), whether any image was
    ``decoded``; the problems found (``problems``, ``count``) and the files' ``sha256`` by source key."""
    src: ImageFolder = spec.source
    problems = Problems(src.root)
    sources: dict[str, dict] = {e.source_key: {} for p in parts for e in p.entries}
    entries = [e for p in parts for e in p.entries]
    bounds, start = [], 0
    for part in parts:
        bounds.append((start, start + len(part.entries)))
        start += len(part.entries)
    found = {p.record["key"]: {"accepted": 0, "rejected": [], "decoded": False} for p in parts}
    writers: dict[int, tuple[RawImageWriter, RawImageWriter]] = {}
    try:
        with WorkerPool(workers_for(len(entries), workers)) as pool:
            chunks = [(i, entries[s:min(s + src.files_per_chunk, stop)]) for i, (first, stop) in enumerate(bounds)
                      for s in range(first, stop, src.files_per_chunk)]
            for chunk in _inspected_chunks(pool, chunks, problems):
                if not chunk.rows:
                    continue
                result = found[parts[chunk.part].record["key"]]
                frame, keep = _check_chunk(src, chunk, problems, sources)
                kept_ids = {e.id for e, _, _ in keep}
                result["rejected"] += [r for r in frame.to_dict("records") if r["id"] not in kept_ids]
                result["decoded"] = True
                if keep:
                    if chunk.part not in writers:
                        name = parts[chunk.part].record["name"]
                        writers[chunk.part] = (RawImageWriter(out / raw_part_path(name)),
                                               RawImageWriter(out / rows_part_path(name), with_bytes=False))
                    for writer in writers[chunk.part]:
                        writer.append(keep)
                result["accepted"] += len(keep)
    finally:
        for pair in writers.values():
            for writer in pair:
                writer.close()
    messages, count = problems.found()
    return {"parts": found, "problems": messages, "count": count,
            "sha256": {k: v["sha256"] for k, v in sources.items() if "sha256" in v}}


def finish_ingest(spec: PipelineSpec, plan: IngestPlan, made: Sequence[dict], out: Path,
                  rows_table: Callable[[dict], Path | None]) -> RawData:
    """``parts.json`` under ``out`` and the report, from the ``plan`` and what ``ingest_parts`` gave
    for its new parts (``made``, in any grouping and order). The suite judges every row of the
    version: the kept parts' rows tables, then the new parts', each with its rejected rows put back
    in id order, as one pass over the folder would feed it. ``rows_table(record)``: a part's rows
    table here (None: a new part that accepted no image)."""
    src: ImageFolder = spec.source
    by_key = {key: found for group in made for key, found in group["parts"].items()}
    missing = [p.record["name"] for p in plan.new if p.record["key"] not in by_key]
    if missing:
        raise RuntimeError(f"part(s) {', '.join(missing[:5])} were ingested by no step; re-execute the whole run")
    suite = ChunkedRawSuite(f"{spec.name}/raw_dataset", image_suite(spec), (), "label")
    for record in plan.kept:
        suite.add(pd.read_parquet(rows_table(record), columns=list(_SUITE_COLUMNS)))
    for part in plan.new:
        found = by_key[part.record["key"]]
        if found["decoded"]:
            suite.add(_suite_frame(rows_table(part.record), found["rejected"]))
    problems = Problems(src.root)
    problems.extend(plan.problems, plan.count)
    sources = {k: dict(v) for k, v in plan.sources.items()}
    place = {p.record["key"]: i for i, p in enumerate(plan.new)}
    # the groups' problems in the order one pass finds them: by their parts' place in the folder
    for group in sorted(made, key=lambda g: min((place[k] for k in g["parts"]), default=-1)):
        problems.extend(group["problems"], group["count"])
        for key, digest in group["sha256"].items():
            sources[key]["sha256"] = digest
    records = plan.kept + [{**p.record, "rows": by_key[p.record["key"]]["accepted"]} for p in plan.new]
    records.sort(key=lambda r: r["first_id"])
    report = suite.finish()
    report.outcomes.append(_class_shares(suite))
    failures = problems.messages()
    if not plan.new and not plan.kept and not failures:
        failures.append(f"{src.root}: no images found in the image folder")
    report = QualityReport(report.asset, report.outcomes, failures)
    out.mkdir(parents=True, exist_ok=True)
    made_index = index([{k: v for k, v in r.items() if k != "reused"} for r in records], plan.salt, plan.target)
    (out / INDEX_NAME).write_text(json.dumps(made_index, indent=2, sort_keys=True))
    return RawData(path=out, rows=sum(r["rows"] for r in records), report=report,
                   sources=[sources[k] for k in sorted(sources)],
                   parts={"reused": len(plan.kept), "new": len(plan.new),
                          "reused_rows": sum(r["rows"] for r in plan.kept)})


def ingest_images(spec: PipelineSpec, files: list[Path], root: Path, out: Path, workers: int | None = None, *,
                  salt: str = "", hashes: Mapping[str, str] | None = None,
                  previous: PreviousParts | None = None) -> RawData:
    """The raw copy under the directory ``out``: ``parts.json`` (the index of every part) and, for
    each new part, ``images/<name>.parquet`` and ``image-rows/<name>.parquet``; in one process
    (assets/image_ingest_steps.py spreads the same three stages over Dagster steps).

    ``hashes`` are the files' sha256 by their path under ``root`` (the data key has read them;
    what is missing is read here). A part of ``previous`` whose images are all still there,
    unchanged, is kept and its images are neither read nor decoded: its rows table goes through
    the suite, so the report is the one a full ingest gives. The other images make new parts."""
    plan = plan_ingest(spec, files, root, salt=salt, hashes=hashes, previous=previous)
    made = ingest_parts(spec, plan.new, out, workers)
    fetched: list[Path] = []

    def rows_table(record: dict) -> Path | None:
        if record["reused"]:  # the previous version's, brought here for the suite and dropped after
            fetched.append(previous.rows(record))
            return fetched[-1]
        local = out / record["rows_table"]
        return local if local.is_file() else None

    try:
        return finish_ingest(spec, plan, [made], out, rows_table)
    finally:
        for path in fetched:
            path.unlink(missing_ok=True)


def _suite_frame(rows_table: Path | None, rejected: list[dict]) -> pd.DataFrame:
    """A new part's rows as the suite saw them while checking: its accepted rows and its rejected
    ones, in id order, with the dtypes a checked chunk has (Python ints: int64)."""
    accepted = (pd.read_parquet(rows_table, columns=list(_SUITE_COLUMNS)) if rows_table is not None
                else pd.DataFrame(columns=list(_SUITE_COLUMNS)))
    frame = pd.concat([accepted, pd.DataFrame(rejected, columns=list(_SUITE_COLUMNS))], ignore_index=True)
    frame = frame.sort_values("id", kind="stable").reset_index(drop=True)
    return frame.astype({"width": "int64", "height": "int64"})


def _inspected_chunks(pool: WorkerPool, chunks: list[tuple[int, list[Entry]]], problems: Problems) -> Iterator[_Chunk]:
    """``chunks`` of (part index, entries) with each image's (info, problem), checked on the pool;
    files that cannot be read or are empty are reported here and never sent."""
    limit = Image.MAX_IMAGE_PIXELS  # the caller's bomb limit travels with each task

    def jobs():
        for index_, (part, entries) in enumerate(chunks):
            readable = []
            for entry in entries:
                content = _read(entry, problems)
                if content is not None:
                    readable.append((entry, content))
            step = task_size(len(readable), pool.workers)
            for s in range(0, len(readable), step):
                chunk_part = readable[s:s + step]
                yield (index_, part, chunk_part), ([c for _, c in chunk_part], [e.extension for e, _ in chunk_part],
                                                   limit)

    current, current_index = None, None
    for (index_, part, chunk_part), results in pool.ordered(inspect_task, jobs()):
        if index_ != current_index:
            if current is not None:
                yield current
            current, current_index = _Chunk(part, []), index_
        current.rows += [(entry, info, problem, content)
                         for (entry, content), (info, problem) in zip(chunk_part, results)]
    if current is not None:
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

