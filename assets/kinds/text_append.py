"""A text corpus that grew, ingested by its new documents alone (issue 41, item 3): files added
after the published ones, lines appended to its last JSONL file, or both.

A whole read (text_ingest.py) reads every file, checks every document and writes the raw copy.
When the published version's ingest left a record (``text_ingest.corpus_record``) and the corpus
is provably that corpus grown (``plan``), ``ingest_new`` reads, checks and writes the new
documents only, and gives the report, the raw copy and the record a whole read of the grown
corpus gives, byte for byte. The proof, step by step; a step that fails names itself and the
file it is about, and the whole read runs as before:

1. **The same ingest.** The pipeline's parameters (the reader's: text field, label field,
   min/max chars, docs_per_chunk, among them) and the platform's ingest code are the published
   version's (the data key's ``parameters`` and ``code``).
2. **A growth.** The published files come first in the corpus (in path order, which is the raw
   copy's), all but the last unchanged (size and sha256); the last unchanged, or a JSONL file
   that ended with a line end when published and whose first ``old size`` bytes hash to the
   published sha256 (only that prefix is read to prove it). New files sort after it. A published
   file removed, renamed or changed, or a new file sorting before a published one, is no growth.
   Symbolic links are never built on (their target can change unseen).
3. **The same documents.** A whole read reads each file on its own, and each JSONL line on its
   own: the grown file's new lines (numbered and offset from the published line count and size)
   and the new files give the documents, and the problems, a whole read gives after the
   published ones. The published version passed, so every published document is in its raw copy.
4. **The same chunks and verdicts.** A chunk's bounds depend only on the documents before it: the
   published copy's last, partial chunk (its last row group, ``tail`` documents) is read back and
   joined with the first new documents, as a whole read chunks them; the document expectations
   resume from their recorded state before that chunk, so every chunk is checked as there; the
   corpus and class tables use the counts of every document.
5. **The same raw copy.** The published row groups are copied as bytes (assets/parquet_splice.py),
   but the partial last one, written again joined with the new documents; then the footer one
   writer of all of them writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

import pyarrow.parquet as pq

from assets import parquet_splice
from assets.kinds.text_ingest import (
    RECORD_VERSION,
    RawCopyWriter,
    TextRawData,
    Written,
    corpus_record,
    ingest_whole,
    report_of,
    write_documents,
)
from assets.kinds.text_quality import DocumentExpectations, class_names_of
from assets.kinds.text_read import Document, Problems, read_appended_lines, read_documents, relative_name
from core.spec import PipelineSpec


class NotAppended(Exception):
    """A step of the proof failed past planning (the published raw copy): read the corpus whole."""


@dataclass(frozen=True)
class PublishedCorpus:
    """The published version's ingest record, and how to fetch its raw copy (store path -> local file)."""

    record: dict
    fetch: Callable[[Path], Path]  # the published documents.parquet, downloaded to the given path


@dataclass(frozen=True)
class Plan:
    files: list[Path]  # the corpus's files now, in path order
    old: list[dict]  # the record's files
    grown: Path | None  # the last published file, when lines were appended to it
    new: list[Path]  # the files after the published ones
    hashes: dict[str, str]  # sha256 of every file now, by relative name


def ingest_corpus(spec: PipelineSpec, files: list[Path], root: Path, out: Path, *, key: dict | None = None,
                  hashes: dict[str, str] | None = None, published: PublishedCorpus | None = None) -> TextRawData:
    """The raw copy of the corpus: by its new documents alone where the proof holds (the module's
    docstring), else every document read; ``how`` says which and, for a whole read, why."""
    why = "no published version with this run's parameters and code to build on" if published is None else None
    if published is not None:
        planned = plan(spec, files, root, key, hashes, published.record)
        if isinstance(planned, str):
            why = planned
        else:
            try:
                return ingest_new(spec, root, out, planned, published)
            except NotAppended as exc:
                why = str(exc)
    return ingest_whole(spec, files, root, out, key=key, hashes=hashes, why=why)


def plan(spec: PipelineSpec, files: list[Path], root: Path, key: dict | None, hashes: dict[str, str] | None,
         record: dict) -> Plan | str:
    """Steps 1 and 2 of the proof: a Plan, or why the corpus is not the published one grown."""
    if record.get("version") != RECORD_VERSION:
        return (f"the published version left no text ingest record of version {RECORD_VERSION} "
                "(made before new documents were ingested alone)")
    if record.get("not_appendable"):
        return f"the published version cannot be built on: {record['not_appendable']}"
    if key is None:
        return "no data key to compare with the published version's"
    if (key["parameters"], key["code"]) != (record["parameters"], record["code"]):
        return ("the pipeline's parameters (the reader's among them) or the platform's ingest code changed since "
                "the published version")
    files = sorted(files, key=lambda f: relative_name(f, root))
    names = [relative_name(f, root) for f in files]
    links = [n for n, f in zip(names, files) if f.is_symlink()]
    if links:
        return f"{links[0]} is a symbolic link, whose target may change unseen"
    old = record["files"]
    moved = _moved([o["file"] for o in old], names)
    if moved:
        return moved
    hashes = {n: (hashes or {}).get(n) or _sha256(f) for n, f in zip(names, files)}
    for name, was in zip(names, old[:-1]):
        if (files[names.index(name)].stat().st_size, hashes[name]) != (was["bytes"], was["sha256"]):
            return (f"{name} changed since the published version ({was['bytes']} bytes then, "
                    f"{files[names.index(name)].stat().st_size} now, or other content): only the last published "
                    "file may grow, and only by lines appended to a JSONL file")
    last = files[len(old) - 1]
    grown = _grown(last, old[-1], hashes[old[-1]["file"]])
    if isinstance(grown, str):
        return grown
    new = files[len(old):]
    if grown is None and not new:
        return "the corpus's files are the published ones, unchanged"
    return Plan(files=files, old=old, grown=grown, new=new, hashes=hashes)


def _moved(old: list[str], now: list[str]) -> str | None:
    """Why the published files are not the first of the corpus, in order; None when they are."""
    gone = [name for name in old if name not in now]
    if gone:
        return (f"{gone[0]} was published but is not in the corpus now (removed or renamed): only files added "
                "after the published ones are ingested alone")
    for was, name in zip(old, now):
        if was != name:  # every published name is there, so a name between them is a new one
            return (f"the new file {name} sorts before the published {was}: the raw copy's order (files by path) "
                    "puts its documents among the published ones, so every document is read")
    return None


def _grown(path: Path, old: dict, sha256: str) -> Path | None | str:
    """``path`` when lines were appended to the last published file, None when it is unchanged,
    or why it changed otherwise than by appended lines."""
    name, start, size = old["file"], old["bytes"], path.stat().st_size
    if size == start and sha256 == old["sha256"]:
        return None
    if not name.endswith(".jsonl"):
        return f"{name} changed since the published version: a .txt file is one document, never grown"
    if size <= start:
        return f"{name} did not grow ({start} bytes published, {size} now): edited, not appended to"
    if not old["ends_line"]:
        return f"{name} did not end with a line end when published: its last line may go on in the new bytes"
    if _sha256(path, start) != old["sha256"]:
        return f"{name}'s first {start} bytes are not the published file's: edited, not appended to"
    return path


def _sha256(path: Path, n: int | None = None) -> str:
    """sha256 of the file's first ``n`` bytes (None: all of it)."""
    h, left = hashlib.sha256(), n
    with path.open("rb") as f:
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            left = None if left is None else left - len(block)
    return h.hexdigest()


def ingest_new(spec: PipelineSpec, root: Path, out: Path, plan: Plan, published: PublishedCorpus) -> TextRawData:
    """Steps 3 to 5: the new documents read, checked and written after the published raw copy's."""
    rec = published.record
    raw_file = published.fetch(out.parent / "published-documents.parquet")
    raw = pq.ParquetFile(raw_file)
    groups, tail = raw.num_row_groups, rec["tail"]
    if (groups, raw.metadata.num_rows) != (rec["row_groups"], rec["documents"]) or \
            (tail and raw.metadata.row_group(groups - 1).num_rows != tail):
        raise NotAppended(f"the published raw copy ({groups} row groups, {raw.metadata.num_rows} documents) is not "
                          f"the one its record describes ({rec['row_groups']}, {rec['documents']})")
    problems = Problems()
    expectations = DocumentExpectations(spec)
    expectations.resume(rec["expectations"])
    per_file: dict[str, int] = {}
    lines = {o["file"]: o["lines"] for o in plan.old if "lines" in o}
    added_file = out.parent / "added-documents.parquet"
    with RawCopyWriter(added_file, labelled=bool(class_names_of(spec))) as writer:
        # the published last chunk's documents (all accepted: the version passed) go first, as in a whole read
        pending = _row_group_documents(raw, groups - 1) if tail else []
        written = write_documents(spec, chain(pending, _new_documents(spec, root, plan, problems, per_file, lines)),
                                  writer, expectations, problems)
    try:
        parquet_splice.splice(raw_file, groups - 1 if tail else groups, added_file, out)
    except parquet_splice.SpliceError as exc:
        raise NotAppended(f"the published raw copy cannot be extended as a writer would: {exc}") from exc
    finally:
        added_file.unlink(missing_ok=True)
    report = report_of(spec, expectations, problems, len(plan.files))
    sources = _sources(plan, root, per_file)
    rows = rec["documents"] - tail + written.rows
    new_documents = written.parsed - tail
    done = TextRawData(path=out, rows=rows, report=report, sources=sources, how=(
        f"only the new documents read: {new_documents} new document(s) of {_what(plan, root)} parsed and "
        f"checked after the published version's {rec['documents']}; its raw copy's "
        f"{groups - 1 if tail else groups} row group(s) kept as bytes, the expectations resumed from its state"))
    if not report.passed:
        return done
    key = {"parameters": rec["parameters"], "code": rec["code"]}
    record = corpus_record(key, sources, lines, plan.files, root, _whole(written, rec, tail), out)
    return replace(done, record=record)


def _whole(written: Written, rec: dict, tail: int) -> Written:
    """The ``Written`` of a whole read of the grown corpus: its rows and documents in all; its last
    partial chunk and the state before it are this read's (a whole read's chunks from the
    published last full one on are this read's chunks)."""
    before = rec["documents"] - tail
    return Written(before + written.rows, before + written.parsed, written.tail, written.before_tail)


def _new_documents(spec: PipelineSpec, root: Path, plan: Plan, problems: Problems, per_file: dict[str, int],
                   lines: dict[str, int]) -> Iterator[Document]:
    """The grown file's appended lines, then the new files' documents: what a whole read reads after
    the published documents."""
    if plan.grown is not None:
        old = plan.old[-1]
        yield from read_appended_lines(spec.source, plan.grown, old["file"], old["bytes"], old["lines"], problems,
                                       per_file, lines)
    yield from read_documents(spec.source, plan.new, root, problems, per_file, lines)


def _row_group_documents(raw: pq.ParquetFile, index: int) -> list[Document]:
    """A published row group's documents, as they were read (their file is their id's, less a line)."""
    table = raw.read_row_group(index).to_pydict()
    labels = table.get("label") or [None] * len(table["id"])
    return [Document(id=i, file=i if i.endswith(".txt") else i.rpartition(":")[0], text=t, label=label)
            for i, t, label in zip(table["id"], table["text"], labels)]


def _sources(plan: Plan, root: Path, per_file: dict[str, int]) -> list[dict]:
    """``text_ingest.describe`` of the grown corpus, from the record and the new files alone."""
    out = []
    for was in plan.old:
        entry = {k: was[k] for k in ("file", "bytes", "documents", "sha256")}
        if plan.grown is not None and was is plan.old[-1]:
            entry.update(bytes=plan.grown.stat().st_size, documents=was["documents"] + per_file.get(was["file"], 0),
                         sha256=plan.hashes[was["file"]])
        out.append(entry)
    for path in plan.new:
        name = relative_name(path, root)
        out.append({"file": name, "bytes": path.stat().st_size, "documents": per_file.get(name, 0),
                    "sha256": plan.hashes[name]})
    return out


def _what(plan: Plan, root: Path) -> str:
    """The new documents' files for the log: the grown one (from which byte on) and the new ones."""
    parts = []
    if plan.grown is not None:
        parts.append(f"{plan.old[-1]['file']} (bytes {plan.old[-1]['bytes']} on)")
    if plan.new:
        names = [relative_name(p, root) for p in plan.new]
        parts.append(f"the new file(s) {', '.join(names[:5])}" + (", ..." if len(names) > 5 else ""))
    return " and ".join(parts)
