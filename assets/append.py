"""A table source that grew, ingested by what it gained alone (issue 41, item 3): rows appended to
its last file, files added after its published ones, or both.

The raw asset's full ingest (assets/ingest.py) reads every row, runs the raw suite over them and
writes the raw copy. When the published version's ingest left a record (``record``) and the new
source is provably that source grown (``plan``), ``ingest_appended`` parses, checks and converts
the new rows only, and gives the report, the raw copy and the record a full ingest of the grown
source gives. The proof, step by step; a step that fails names itself (and the file it is about)
and the full ingest runs as before:

1. **The same ingest.** The pipeline's parameters (its suite among them) and the platform's
   ingest code are those of the published version (the data key's ``parameters`` and ``code``).
2. **A growth.** The published files come first in the source, by name and in order, and all
   but the last are unchanged (size and sha256). The last is unchanged or longer: its first
   ``old size`` bytes hash to the recorded sha256 (only that prefix is read to prove it), and it
   ended at a line end. New files, if any, come after it. A published file removed, renamed,
   moved or changed, or a new file that sorts before a published one, is no growth.
3. **The same parse.** A full ingest parses each file on its own (assets/source.py
   ``_source_chunks``): no chunk spans two files, and a file's types come from that file alone
   (Arrow's first piece of it, pandas' chunk, a Parquet file's schema). So a new file parses
   here as there, given the same reader: Arrow for the CSV files it applies to when the
   published version was read by Arrow, or by pandas only because no CSV file was Arrow's then;
   pandas when Arrow fell back on a published file (it falls back there again, before reaching
   the new files). A new file that Arrow cannot read as pandas would makes a full ingest read
   every file with pandas: so do we. The grown last file was read by Arrow, which fixes each
   column's type from a file's first piece and parses every later piece with those types; the
   old file held a whole piece after its header, so a whole parse of the grown file has that
   same first piece, those types, and hence the rows ``appended_frames`` gives. A new value that
   does not fit them is where a whole parse falls back to pandas: so do we.
4. **The same chunks.** The grown file's new rows are cut where a whole parse cuts them: the
   first new chunk completes the published version's last, partial chunk, and that joined
   chunk's dtypes must be its two halves' (a null turns pandas' int64 to float64), so the
   per-chunk checks are the same on every row. A new file's chunks are its own; each must have
   the published last chunk's columns and dtypes. (Stricter than the verdicts need, since a
   full ingest checks each chunk on its own too; but a source whose schema changed is worth one
   whole look, and its key table then keeps one type per column.)
5. **The same verdicts.** Per-chunk expectations add their counts to the published version's
   sums (``mostly`` applied to the totals); whole-table ones run on the published key table
   (ids, labels, row hashes: what ``ChunkedRawSuite`` keeps of every row, ``keys.parquet``)
   plus the new rows' keys; class shares from the recorded counts plus the new ones; the
   platform's unique-id rule on the raw copy's ids plus the new ones. No expectation is judged
   on the new rows alone.
6. **The same raw copy.** The published copy's row groups (one per chunk) are copied as bytes
   (assets/parquet_splice.py), but for a last, partial one that a grown file's first new chunk
   completes (decoded and written again, joined), then one row group per new chunk, and the
   footer a writer of all of them writes: the bytes a full ingest writes. Old rows are never
   parsed from text, decoded, converted or checked again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from assets import arrow_csv, ingest, parquet_splice
from assets.arrow_csv import ArrowFallback
from assets.ingest import Ingested, _fresh
from assets.quality.chunked import ChunkedRawSuite
from assets.source import SourceChunks, SourceError, file_sha256, iter_file_chunks, validated_arrays
from core.spec import PipelineSpec

# A record's layout and meaning: a change to what a record holds bumps this. (A change to this module
# or to assets/arrow_csv.py also changes the data key's code, assets/data_key.py DATA_CODE, so no
# version built on an older record is reused.) 2: records of sources read by pandas, or whose last
# file is Parquet, too (new files can follow them); the reader; why the last file cannot grow.
RECORD_VERSION = 2


class NotAppended(Exception):
    """A step of the proof failed past planning (a new value, the chunks' dtypes): read it whole."""


@dataclass(frozen=True)
class Published:
    """The published version's ingest record, and how to fetch its files (the raw copy at
    ``ingest.raw_path``, the key table at ``ingest.keys_path``) to a local path."""

    record: dict
    fetch: Callable[[str, Path], Path]


def ingest_source(spec: PipelineSpec, asset: str, suite: Mapping[str, Sequence[Any]] | None, chunks, out: Path, *,
                  key: Mapping[str, str] | None, published: Published | None,
                  hashes: Mapping[str, str] | None = None) -> Ingested:
    """``ingest.ingest_chunks``' result for the source, by its new rows alone where the proof
    holds (the module's docstring), with the record a later version builds on; ``how`` says which
    and, for a full ingest, why. ``hashes``: the files' sha256 already computed this run (for the
    data key), by path (``str(path)``: two folders may hold files of one name), hashed again never."""
    why = "no published version to build on" if published is None else None
    if published is not None:
        planned = plan(spec, chunks, suite, key, published.record, hashes=hashes)
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
    made, keys = record(spec, chunks, key, done, out.parent / "keys.parquet", hashes=hashes)
    return replace(done, record=made, keys=keys)


@dataclass(frozen=True)
class Plan:
    files: list[Path]  # the source's files now
    grown: Path | None  # the last published file, when rows were appended to it
    start: int  # its published size: where its new rows begin
    sha256: str  # the last published file's sha256 now, whole (for the next version's record)
    new: list[Path]  # the files after the published ones
    record: dict
    hashes: Mapping[str, str] | None = None  # the files' sha256 this run already computed, by path


def record(spec: PipelineSpec, chunks: SourceChunks, key: Mapping[str, str] | None, ingested: Ingested,
           keys_out: Path, hashes: Mapping[str, str] | None = None) -> tuple[dict, Path | None]:
    """(the record a passed full ingest leaves for a later version, its key table's file or None).
    A version that cannot be built on says why in ``not_appendable``."""
    index = len(chunks.files) - 1
    fixed = chunks.fixed.get(index) if ingested.reader == "arrow" else None  # a fallback leaves some behind
    return record_of(key, [described(f, hashes) for f in chunks.files],
                     file_end(spec, chunks.files[-1], fixed), ingested, keys_out)


def record_of(key: Mapping[str, str] | None, files: list[dict], end: dict, ingested: Ingested,
              keys_out: Path) -> tuple[dict, Path | None]:
    """``record`` from the files' descriptions (``described``) and the last file's ``file_end``:
    what a source ingested over several steps, each describing its own files, records."""
    last = ingested.last_chunk
    why = "no data key" if key is None else "no rows" if last is None else None
    if why:
        return {"version": RECORD_VERSION, "not_appendable": why}, None
    return _record(key, files, last_file_of(ingested.reader, end), last, ingested, ingested.checker, keys_out)


def described(path: Path, hashes: Mapping[str, str] | None = None) -> dict:
    """A source file as a record names it; its sha256 from ``hashes`` (by path) when it is there."""
    sha256 = (hashes or {}).get(str(path)) or file_sha256(path)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256}


def file_end(spec: PipelineSpec, path: Path, fixed: dict | None) -> dict:
    """What ``last_file`` needs of a source's last file, read where the file lies: its name, whether
    Arrow applies to it, whether it ends at a line end, the types Arrow's first piece fixed (None
    when Arrow did not read it). Plain data: a step that read the file hands it on."""
    applies = arrow_csv.applies(spec, path)
    return {"name": path.name, "applies": applies, "ends_line": _ends_line(path) if applies and fixed else None,
            "fixed": fixed}


def last_file(spec: PipelineSpec, reader: str, path: Path, fixed: dict | None) -> dict:
    """What rows appended to the source's last file are parsed with (its end, the types Arrow's
    first piece fixed), or why they cannot be ingested alone (``not_growable``)."""
    return last_file_of(reader, file_end(spec, path, fixed))


def last_file_of(reader: str, end: dict) -> dict:
    """``last_file`` from the file's ``file_end`` and the reader of the whole source."""
    if not end["applies"]:
        why = f"{end['name']} is not a CSV file Arrow read"
    elif reader != "arrow" or not end["fixed"]:
        why = f"read by {reader}, which infers types chunk by chunk"
    else:
        return {"ends_line": end["ends_line"], "fixed": end["fixed"], "not_growable": None}
    return {"ends_line": None, "fixed": None, "not_growable": why}


def _record(key, files: list[dict], last_file_: dict, last: dict, ingested, checker, keys_out: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.write_table(pa.Table.from_pandas(checker.key_table(), preserve_index=False), keys_out)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # e.g. a key column holding numbers and text
        return {"version": RECORD_VERSION, "not_appendable": f"the key table does not store as Parquet: {exc}"}, None
    return {"version": RECORD_VERSION, "parameters": key["parameters"], "code": key["code"], "files": files,
            "reader": ingested.reader, **last_file_, "last_chunk": last, "rows": ingested.rows,
            "columns": ingested.columns, "suite": checker.state()}, keys_out


def _ends_line(path: Path) -> bool:
    """Whether the file ends with a line end. Arrow parsed it whole, so its quotes are balanced:
    that line end lies outside quotes and the next byte starts a row."""
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def plan(spec: PipelineSpec, chunks, suite, key: Mapping[str, str] | None, published: dict,
         hashes: Mapping[str, str] | None = None) -> Plan | str:
    """The proof's steps 1 and 2, and what of step 3 needs no parse: a Plan, or why not.
    ``hashes``: as ``ingest_source``'s."""
    why = premise(suite, key, published)
    if why is not None:
        return why
    if not isinstance(chunks, SourceChunks):
        return "no source files, suite or data key to build on"
    old, files = published["files"], chunks.files
    moved = _moved([o["file"] for o in old], [f.name for f in files])
    if moved:
        return moved
    for f, o in zip(files, old[:-1]):
        if _changed(f, o, hashes):
            return (f"{f.name} changed since the published version ({o['bytes']} bytes then, {f.stat().st_size} "
                    "now, or other content): only the last published file may grow, and only by appended rows")
    last, new = files[len(old) - 1], files[len(old):]
    grown = _grown(spec, last, old[-1], published, hashes)
    if isinstance(grown, str):
        return grown
    if grown is None and not new:
        return "the source's files are the published ones, unchanged"
    start, sha256 = grown if grown is not None else (old[-1]["bytes"], old[-1]["sha256"])
    return Plan(files=files, grown=last if grown is not None else None, start=start, sha256=sha256, new=new,
                record=published, hashes=hashes)


def premise(suite, key: Mapping[str, str] | None, published: dict) -> str | None:
    """The proof's step 1, and a record to build on, before any file is read: why not, or None."""
    if published.get("version") != RECORD_VERSION:
        return (f"the published version left no ingest record of version {RECORD_VERSION} "
                "(made before new rows or files were ingested alone)")
    if published.get("not_appendable"):
        return f"the published version cannot be appended to: {published['not_appendable']}"
    if suite is None or key is None:
        return "no source files, suite or data key to build on"
    if (key["parameters"], key["code"]) != (published["parameters"], published["code"]):
        return "the pipeline's parameters or the platform's ingest code changed since the published version"
    return None


def _moved(old: list[str], now: list[str]) -> str | None:
    """Why the published files are not the first of the source, in order; None when they are."""
    gone = [name for name in old if name not in now]
    if gone:
        return (f"{gone[0]} was published but is not in the source now (removed or renamed): only files added "
                "after the published ones are ingested alone")
    for i, (was, name) in enumerate(zip(old, now)):
        if was != name:
            if name in old:
                return (f"{name} is file {i + 1} of the source now, file {old.index(name) + 1} when published: "
                        "the files were reordered")
            return (f"the new file {name} comes before the published {was} in the source's order: only files "
                    "after the published ones are ingested alone")
    return None


def _changed(path: Path, published: dict, hashes: Mapping[str, str] | None = None) -> bool:
    return path.stat().st_size != published["bytes"] or described(path, hashes)["sha256"] != published["sha256"]


def _grown(spec: PipelineSpec, path: Path, old: dict, published: dict,
           hashes: Mapping[str, str] | None = None) -> tuple[int, str] | str | None:
    """(its published size, its sha256 now) when rows were appended to the last published file,
    None when it is unchanged, or why it changed otherwise than a whole parse can be proven on."""
    start, size = old["bytes"], path.stat().st_size
    if size == start and described(path, hashes)["sha256"] == old["sha256"]:
        return None
    if size <= start:
        return f"{path.name} did not grow ({start} bytes published, {size} now): edited, not appended"
    if published["not_growable"]:
        return f"{path.name} grew, but rows appended to it cannot be parsed alone: {published['not_growable']}"
    if not published["ends_line"]:
        return f"{path.name} did not end with a line end when published: its last row may go on"
    fixed = published["fixed"]
    if fixed["piece_bytes"] != arrow_csv.piece_bytes(spec):
        return (f"Arrow's pieces are {arrow_csv.piece_bytes(spec)} bytes now, {fixed['piece_bytes']} when published: "
                "a whole parse would fix its types from another first piece")
    if start - fixed["header_bytes"] < fixed["piece_bytes"]:
        return (f"{path.name} held less than one Arrow piece ({fixed['piece_bytes']} bytes) when published: "
                "a whole parse would infer its types from the appended rows too")
    prefix, whole = _prefix_sha256(path, start)
    if prefix != old["sha256"]:
        return f"{path.name}'s first {start} bytes are not the published file's: edited, not appended"
    return start, whole


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


def new_files_reader(spec: PipelineSpec, published: str, new: list[Path]) -> tuple[bool, str]:
    """(whether Arrow reads the new files' CSV, the reader a full ingest of the grown source names),
    from the published version's reader (step 3 of the module's docstring)."""
    if published == "arrow":
        return True, "arrow"
    if published == "pandas" and any(arrow_csv.applies(spec, path) for path in new):
        # no published file was Arrow's, so a full ingest reads them as they were read, and the new CSV with Arrow
        return True, "arrow"
    return False, published  # pandas throughout: no CSV file is Arrow's, or Arrow fell back on a published one


def ingest_appended(spec: PipelineSpec, asset: str, suite: Mapping[str, Sequence[Any]], plan: Plan, published,
                    out: Path):
    """Steps 3 to 6: the new rows parsed, checked and written after the published raw copy's.
    Raises ``NotAppended`` where a whole parse would give other chunks or fall back to pandas."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rec, rows = plan.record, spec.chunk_rows
    tmp = out.parent
    raw_file = published.fetch(ingest.raw_path(spec.name), tmp / "published.parquet")
    raw = pq.ParquetFile(raw_file, pre_buffer=False)
    keys = pq.read_table(published.fetch(ingest.keys_path(spec.name), tmp / "published-keys.parquet")).to_pandas()
    last = rec["last_chunk"]
    groups = raw.num_row_groups
    if not groups or raw.metadata.row_group(groups - 1).num_rows != last["rows"] or raw.metadata.num_rows != rec["rows"]:
        raise NotAppended("the published raw copy's row groups are not its source's chunks")
    checker = ChunkedRawSuite(asset, suite, spec.feature_columns, spec.label_column, task=spec.task,
                              label_columns=spec.label_columns)
    checker.resume(rec["suite"], keys)
    joined = plan.grown is not None and last["rows"] < rows  # the first new chunk completes the published last one
    arrow, reader = new_files_reader(spec, rec["reader"], plan.new)
    fixed: dict[Path, dict] = {path: {} for path in plan.new}  # the types Arrow's first piece of each fixed
    added_file = tmp / "added.parquet"  # the new row groups, put after the published ones' bytes at the end
    added_file.unlink(missing_ok=True)
    writer = ingest._ParquetAppender(added_file, spec)
    error, new_ids, added, shape = None, [], 0, last
    try:
        for chunk, completes in _new_chunks(spec, plan, rows, joined, arrow, fixed):
            shape = ingest.chunk_shape(chunk)
            if completes:
                shape = {**shape, "rows": last["rows"] + len(chunk)}
            added += len(chunk)
            checker.add(chunk)
            if error is None and len(chunk):
                try:
                    features, targets, chunk_ids = validated_arrays(spec, chunk)
                except SourceError as exc:
                    error = str(exc)
                    continue
                if spec.id_column:
                    new_ids.append(chunk_ids.astype(str))
                table = writer.table(features, targets, chunk_ids)
                if completes:
                    table = writer.single(pa.concat_tables([writer.single(raw.read_row_group(groups - 1)), table]))
                writer.append_table(table)
    finally:
        writer.close()
    try:  # the published row groups as bytes, but a last one the first new chunk completed
        parquet_splice.splice(raw_file, groups - 1 if joined else groups,
                              added_file if added_file.exists() else None, out)
    except parquet_splice.SpliceError as exc:
        raise NotAppended(f"the published raw copy cannot be extended as a writer would: {exc}") from exc
    if error is None and spec.id_column:
        old_ids = raw.read(columns=[spec.id_column]).column(0).to_numpy(zero_copy_only=False).astype(str)
        error = ingest._duplicate_ids(spec, [old_ids, *new_ids])
    report = checker.finish().with_failure(error)
    done = Ingested(report=report, rows=rec["rows"] + added, columns=rec["columns"], path=out, reader=reader,
                    appended_to=rec["rows"], how=f"appended to the published version's {rec['rows']} row(s): {added} new row(s) of "
                        f"{_what(plan)} parsed and checked, the raw suite judged on every row from the published "
                        "sums and key table")
    if not report.passed:
        return done
    grown = rec["files"][-1] if plan.grown is None else \
        {"file": plan.grown.name, "bytes": plan.grown.stat().st_size, "sha256": plan.sha256}
    files = [*rec["files"][:-1], grown, *(described(p, plan.hashes) for p in plan.new)]
    tail = plan.new[-1] if plan.new else plan.grown
    last_file_ = last_file(spec, reader, tail, fixed[tail].get(0) if plan.new else rec["fixed"])
    record_, keys_file = _record({"parameters": rec["parameters"], "code": rec["code"]}, files, last_file_, shape,
                                 done, checker, tmp / "keys.parquet")
    return replace(done, record=record_, keys=keys_file)


def _what(plan: Plan) -> str:
    """The new rows' files for the log: the grown one (from which byte on) and the new ones."""
    grown = f"{plan.grown.name} (bytes {plan.start} on)" if plan.grown is not None else None
    new = f"the new file(s) {', '.join(p.name for p in plan.new)}" if plan.new else None
    return " and ".join(w for w in (grown, new) if w)


def _new_chunks(spec: PipelineSpec, plan: Plan, rows: int, joined: bool, arrow: bool,
                fixed: dict[Path, dict]) -> Iterator[tuple[pd.DataFrame, bool]]:
    """(chunk, whether it completes the published last chunk): the grown file's new rows, then the
    new files', as a whole parse cuts them; ``NotAppended`` where it would not (steps 3 and 4)."""
    last = plan.record["last_chunk"]
    if plan.grown is not None:
        frames = arrow_csv.appended_frames(spec, plan.grown, plan.start, plan.record["fixed"],
                                           rows - last["rows"] if joined else rows, rows)
        for n, chunk in enumerate(_parsed(frames, "an appended row does not parse with the published version's "
                                                  "column types")):
            dtypes = ingest.chunk_shape(chunk)["dtypes"]
            if n == 0 and joined and dtypes != last["dtypes"]:
                raise NotAppended(f"the appended rows would change the dtypes of the chunk they complete "
                                  f"({_changed_dtypes(last['dtypes'], dtypes)}), whose checks then see other values")
            yield chunk, n == 0 and joined
    for path in plan.new:
        frames = iter_file_chunks(spec, path, rows, arrow=arrow, fixed=fixed[path])
        for chunk in _parsed(frames, f"the new file {path.name} does not parse with Arrow as pandas would, so a "
                                     "full ingest reads every file with pandas"):
            dtypes = ingest.chunk_shape(chunk)["dtypes"]
            if dtypes != last["dtypes"]:
                raise NotAppended(f"the new file {path.name} has other columns or dtypes than the published rows "
                                  f"({_changed_dtypes(last['dtypes'], dtypes)}): a changed schema is read whole")
            yield chunk, False


def _changed_dtypes(old: dict, new: dict) -> str:
    """How a chunk's dtypes differ from the published ones (a record keeps them in sorted order)."""
    missing, extra = [c for c in old if c not in new], [c for c in new if c not in old]
    if missing or extra:
        return f"columns {missing[:3]} missing, {extra[:3]} new"
    changed = {c: f"{old[c]} -> {t}" for c, t in new.items() if old[c] != t}
    return str(dict(list(changed.items())[:3]))


def _parsed(frames, why: str):
    """The new rows' frames; a value that does not parse as a whole parse parses it ends the append."""
    try:
        yield from frames
    except ArrowFallback as exc:
        raise NotAppended(f"{why}: {exc}") from exc
