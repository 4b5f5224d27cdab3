"""A table source that grew by appended rows, ingested by those rows alone (issue 41, item 3).

The raw asset's full ingest (assets/ingest.py) reads every row, runs the raw suite over them and
writes the raw copy. When the published version's ingest left a record (``record``) and the new
source is provably that source with rows appended (``plan``), ``ingest_appended`` parses, checks
and converts the new rows only, and gives the report, the raw copy and the record a full ingest
of the grown source gives. The proof, step by step; a step that fails names itself and the
full ingest runs as before:

1. **The same ingest.** The pipeline's parameters (its suite among them) and the platform's
   ingest code are those of the published version (the data key's ``parameters`` and ``code``).
2. **An append.** The same files, in order; all but the last unchanged (size and sha256); the
   last one longer, its first ``old size`` bytes hashing to the recorded sha256 (only that prefix
   is read to prove it), and the old file ended at a line end.
3. **The same parse.** The published version was read by Arrow (assets/arrow_csv.py), which
   fixes each column's type from a file's first piece and parses every later piece with those
   types; the old file held a whole piece after its header, so a whole parse of the grown file
   has that same first piece, those types, and hence the rows ``appended_frames`` gives. A new
   value that does not fit them is where a whole parse falls back to pandas: so do we.
4. **The same chunks.** The new rows are cut where a whole parse cuts them: the first new chunk
   completes the published version's last, partial chunk. That joined chunk's dtypes must be
   its two halves' (a null turns pandas' int64 to float64): the per-chunk checks are then the
   same on every row.
5. **The same verdicts.** Per-chunk expectations add their counts to the published version's
   sums (``mostly`` applied to the totals); whole-table ones run on the published key table
   (ids, labels, row hashes: what ``ChunkedRawSuite`` keeps of every row, ``keys.parquet``)
   plus the new rows' keys; class shares from the recorded counts plus the new ones; the
   platform's unique-id rule on the raw copy's ids plus the new ones. No expectation is judged
   on the new rows alone.
6. **The same raw copy.** The published copy's row groups (one per chunk) are decoded and
   written again as they are, the last, partial one joined with the first new chunk, then one
   row group per new chunk: the bytes a full ingest writes. Old rows are never parsed from
   text, never converted and never checked again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from assets import arrow_csv, ingest
from assets.arrow_csv import ArrowFallback
from assets.ingest import Ingested, _fresh
from assets.quality.chunked import ChunkedRawSuite
from assets.source import SourceChunks, SourceError, file_sha256, validated_arrays
from core.spec import PipelineSpec

# A record's layout and meaning: a change to what a record holds bumps this. (A change to this module
# or to assets/arrow_csv.py also changes the data key's code, assets/data_key.py DATA_CODE, so no
# version built on an older record is reused.)
RECORD_VERSION = 1


class NotAppended(Exception):
    """A step of the proof failed past planning (a new value, the chunks' dtypes): read it whole."""


@dataclass(frozen=True)
class Published:
    """The published version's ingest record, and how to fetch its files (the raw copy at
    ``ingest.raw_path``, the key table at ``ingest.keys_path``) to a local path."""

    record: dict
    fetch: Callable[[str, Path], Path]


def ingest_source(spec: PipelineSpec, asset: str, suite: Mapping[str, Sequence[Any]] | None, chunks, out: Path, *,
                  key: Mapping[str, str] | None, published: Published | None) -> Ingested:
    """``ingest.ingest_chunks``' result for the source, by its appended rows alone where the proof
    holds (the module's docstring), with the record a later append builds on; ``how`` says which
    and, for a full ingest, why."""
    why = "no published version to build on" if published is None else None
    if published is not None:
        planned = plan(spec, chunks, suite, key, published.record)
        if isinstance(planned, str):
            why = planned
        else:
            try:
                return ingest_appended(spec, asset, suite, planned, published, out)
            except NotAppended as exc:
                why, suite = str(exc), _fresh(suite)
    done = ingest.ingest_chunks(spec, asset, suite, chunks, out)
    done = replace(done, how=f"every row read ({done.rows}): {why}")
    if not (done.report.passed and done.checker is not None and isinstance(chunks, SourceChunks)):
        return done
    made, keys = record(spec, chunks, key, done, out.parent / "keys.parquet")
    return replace(done, record=made, keys=keys)


@dataclass(frozen=True)
class Plan:
    files: list[Path]
    grown: Path  # the last file, which the new rows were appended to
    start: int  # its old size: where the new rows begin
    sha256: str  # the grown file's sha256, whole (for the next version's record)
    record: dict


def record(spec: PipelineSpec, chunks: SourceChunks, key: Mapping[str, str] | None, ingested: Ingested,
           keys_out: Path) -> tuple[dict, Path | None]:
    """(the record a passed full ingest leaves for a later append, its key table's file or None).
    A version that cannot be built on says why in ``not_appendable``."""
    last = ingested.last_chunk
    why = _unrecordable(spec, chunks, key, ingested, last)
    if why:
        return {"version": RECORD_VERSION, "not_appendable": why}, None
    files = [{"file": f.name, "bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in chunks.files]
    return _record(key, files, _ends_line(chunks.files[-1]), chunks.fixed[len(chunks.files) - 1], last,
                   ingested, ingested.checker, keys_out)


def _unrecordable(spec, chunks: SourceChunks, key, ingested, last) -> str | None:
    if key is None:
        return "no data key"
    if not ingested.reader.startswith("arrow"):
        return f"read by {ingested.reader}, which infers types chunk by chunk"
    if not arrow_csv.applies(spec, chunks.files[-1]) or not chunks.fixed.get(len(chunks.files) - 1):
        return f"{chunks.files[-1].name} is not a CSV file Arrow read"
    if last is None:
        return "no rows"
    return None


def _record(key, files: list[dict], ends_line: bool, fixed: dict, last: dict, ingested, checker, keys_out: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.write_table(pa.Table.from_pandas(checker.key_table(), preserve_index=False), keys_out)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # e.g. a key column holding numbers and text
        return {"version": RECORD_VERSION, "not_appendable": f"the key table does not store as Parquet: {exc}"}, None
    return {"version": RECORD_VERSION, "parameters": key["parameters"], "code": key["code"], "files": files,
            "ends_line": ends_line, "fixed": fixed, "last_chunk": last, "rows": ingested.rows,
            "columns": ingested.columns, "suite": checker.state()}, keys_out


def _ends_line(path: Path) -> bool:
    """Whether the file ends with a line end. Arrow parsed it whole, so its quotes are balanced:
    that line end lies outside quotes and the next byte starts a row."""
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def plan(spec: PipelineSpec, chunks, suite, key: Mapping[str, str] | None, published: dict) -> Plan | str:
    """The proof's steps 1 to 3 (the module's docstring) that need no parse: a Plan, or why not."""
    if published.get("version") != RECORD_VERSION:
        return "the published version left no ingest record (made before appends were ingested alone)"
    if published.get("not_appendable"):
        return f"the published version cannot be appended to: {published['not_appendable']}"
    if suite is None or key is None or not isinstance(chunks, SourceChunks):
        return "no source files, suite or data key to build on"
    if (key["parameters"], key["code"]) != (published["parameters"], published["code"]):
        return "the pipeline's parameters or the platform's ingest code changed since the published version"
    old, files = published["files"], chunks.files
    if [f.name for f in files] != [o["file"] for o in old]:
        return f"other source files: {[o['file'] for o in old]} published, {[f.name for f in files]} now"
    for f, o in zip(files[:-1], old[:-1]):
        if f.stat().st_size != o["bytes"] or file_sha256(f) != o["sha256"]:
            return f"{f.name} changed, and only the last file may grow"
    grown, start = files[-1], old[-1]["bytes"]
    size = grown.stat().st_size
    if size <= start:
        return f"{grown.name} did not grow ({start} bytes published, {size} now): edited, not appended"
    if not published["ends_line"]:
        return f"{grown.name} did not end with a line end when published: its last row may go on"
    fixed = published["fixed"]
    if fixed["piece_bytes"] != arrow_csv.piece_bytes(spec):
        return (f"Arrow's pieces are {arrow_csv.piece_bytes(spec)} bytes now, {fixed['piece_bytes']} when published: "
                "a whole parse would fix its types from another first piece")
    if start - fixed["header_bytes"] < fixed["piece_bytes"]:
        return (f"{grown.name} held less than one Arrow piece ({fixed['piece_bytes']} bytes) when published: "
                "a whole parse would infer its types from the appended rows too")
    prefix, whole = _prefix_sha256(grown, start)
    if prefix != old[-1]["sha256"]:
        return f"{grown.name}'s first {start} bytes are not the published file's: edited, not appended"
    return Plan(files=files, grown=grown, start=start, sha256=whole, record=published)


def _prefix_sha256(path: Path, n: int) -> tuple[str, str]:
    """(sha256 of the first ``n`` bytes, sha256 of the whole file) in one read."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        left = n
        while left:
            block = f.read(min(1 << 20, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
        prefix = h.hexdigest()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return prefix, h.hexdigest()


def ingest_appended(spec: PipelineSpec, asset: str, suite: Mapping[str, Sequence[Any]], plan: Plan, published,
                    out: Path):
    """Steps 4 to 6: the new rows parsed, checked and written after the published raw copy's.
    Raises ``NotAppended`` where a whole parse would give other chunks or fall back to pandas."""
    import pyarrow.parquet as pq

    rec, rows = plan.record, spec.chunk_rows
    tmp = out.parent
    raw = pq.ParquetFile(published.fetch(ingest.raw_path(spec.name), tmp / "published.parquet"), pre_buffer=False)
    keys = pq.read_table(published.fetch(ingest.keys_path(spec.name), tmp / "published-keys.parquet")).to_pandas()
    last = rec["last_chunk"]
    groups = raw.num_row_groups
    if not groups or raw.metadata.row_group(groups - 1).num_rows != last["rows"] or raw.metadata.num_rows != rec["rows"]:
        raise NotAppended("the published raw copy's row groups are not its source's chunks")
    checker = ChunkedRawSuite(asset, suite, spec.feature_columns, spec.label_column, task=spec.task,
                              label_columns=spec.label_columns)
    checker.resume(rec["suite"], keys)
    joined = last["rows"] < rows  # the first new chunk completes the published version's last one
    writer = ingest._ParquetAppender(out, spec)
    error, new_ids, added, shape = None, [], 0, last
    try:
        for i in range(groups - 1 if joined else groups):
            writer.append_table(writer.single(raw.read_row_group(i)))
        first = rows - last["rows"] if joined else rows
        frames = arrow_csv.appended_frames(spec, plan.grown, plan.start, rec["fixed"], first, rows)
        for n, chunk in enumerate(_parsed(frames)):
            shape = ingest.chunk_shape(chunk)
            if n == 0 and joined and shape["dtypes"] != last["dtypes"]:
                changed = {c: f"{last['dtypes'].get(c)} -> {t}" for c, t in shape["dtypes"].items()
                           if last["dtypes"].get(c) != t}
                raise NotAppended(f"the appended rows would change the dtypes of the chunk they complete "
                                  f"({dict(list(changed.items())[:3])}), whose checks then see other values")
            if n == 0 and joined:
                shape = {**shape, "rows": last["rows"] + len(chunk)}
            added += len(chunk)
            checker.add(chunk)
            if error is None:
                try:
                    features, targets, chunk_ids = validated_arrays(spec, chunk)
                except SourceError as exc:
                    error = str(exc)
                    continue
                if spec.id_column:
                    new_ids.append(chunk_ids.astype(str))
                table = writer.table(features, targets, chunk_ids)
                if n == 0 and joined:
                    import pyarrow as pa

                    table = writer.single(pa.concat_tables([writer.single(raw.read_row_group(groups - 1)), table]))
                writer.append_table(table)
    finally:
        writer.close()
    if error is None and spec.id_column:
        old_ids = raw.read(columns=[spec.id_column]).column(0).to_numpy(zero_copy_only=False).astype(str)
        error = ingest._duplicate_ids(spec, [old_ids, *new_ids])
    report = checker.finish().with_failure(error)
    done = Ingested(report=report, rows=rec["rows"] + added, columns=rec["columns"], path=out,
                           reader="arrow",
                           how=f"appended to the published version's {rec['rows']} row(s): {added} new row(s) of "
                               f"{plan.grown.name} parsed and checked (bytes {plan.start} on), the raw suite "
                               "judged on every row from the published sums and key table")
    if not report.passed:
        return done
    files = [*rec["files"][:-1], {"file": plan.grown.name, "bytes": plan.grown.stat().st_size, "sha256": plan.sha256}]
    record_, keys_file = _record({"parameters": rec["parameters"], "code": rec["code"]}, files,
                                 _ends_line(plan.grown), rec["fixed"], shape, done, checker, tmp / "keys.parquet")
    return replace(done, record=record_, keys=keys_file)


def _parsed(frames):
    """The appended rows' frames; a value that does not fit the published types ends the append."""
    try:
        yield from frames
    except ArrowFallback as exc:
        raise NotAppended(f"an appended row does not parse with the published version's column types: {exc}") from exc
