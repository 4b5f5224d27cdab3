"""A text corpus read whole into its raw copy, and the ingest record a later version's ingest of
new documents alone builds on (text_append.py).

The documents are read ``docs_per_chunk`` at a time (text_read.py), in the raw copy's order (files
by path, lines in file order); each chunk is checked (text_quality.py ``DocumentExpectations``) and
its accepted documents written as one row group of ``documents.parquet``: ``id`` ("<file>:<line>"
or "<file>"), ``text_sha256`` (what a part's key is made of, so the shards' plan reads ids and
hashes rather than every text), ``label`` (classification only), ``chars`` and ``text``. A
chunk's bounds depend only on how many documents came before it, which is what lets new
documents be chunked, checked and written after a published copy's as this whole read would
(text_append.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from assets.kinds.base import RawData
from assets.kinds.text_quality import DocumentExpectations, class_names_of, document_problem
from assets.kinds.text_read import Document, Problems, read_documents, relative_name
from assets.source import file_sha256
from core.spec import PipelineSpec

# A record's layout and meaning; a change to what it holds bumps this. (A change to this module's
# code changes the data key's ``code`` too, assets/data_key.py DATA_CODE "assets/kinds", so a
# version is never built on a record another ingest wrote.)
RECORD_VERSION = 1
TEXT_SHA256 = "text_sha256"  # the raw copy's column of each document's text sha256


@dataclass(frozen=True)
class TextRawData(RawData):
    """``RawData`` with what the raw asset logs and keeps beside the raw copy."""

    how: str = ""  # for the log: the new documents alone read, or why every document was read
    record: dict | None = None  # what a later version's ingest of new documents builds on


@dataclass(frozen=True)
class Written:
    """What ``write_documents`` wrote and saw."""

    rows: int  # documents accepted (the raw copy's rows)
    parsed: int  # documents fed to the expectations since the expectations' resumed state
    tail: int  # documents of the last chunk when it is partial (< docs_per_chunk), else 0
    before_tail: dict  # the expectations' state before that partial chunk (after all when none)


def write_documents(spec: PipelineSpec, documents: Iterable[Document], writer: "RawCopyWriter",
                    expectations: DocumentExpectations, problems: Problems) -> Written:
    """Chunk, check and write ``documents``: the loop both a whole read and an ingest of new
    documents run, so the two cut, check and write the same chunks."""
    size = spec.source.docs_per_chunk
    rows = parsed = tail = 0
    before_tail = None
    for chunk in _chunks(iter(documents), size):
        if len(chunk) < size:  # only the last chunk can be partial: a later version joins new documents to it
            before_tail, tail = expectations.state(), len(chunk)
        expectations.add(chunk)
        kept = _acceptable(spec, chunk, problems)
        writer.write(kept)
        rows += len(kept)
        parsed += len(chunk)
    return Written(rows, parsed, tail, before_tail if before_tail is not None else expectations.state())


def ingest_whole(spec: PipelineSpec, files: list[Path], root: Path, out: Path, *, key: dict | None,
                 hashes: dict[str, str] | None, why: str) -> TextRawData:
    """Every document of ``files`` read, checked and written to ``out``; the record a later
    version builds on when the report passed (``why``: why every document was read, for the log;
    ``hashes``: the files' sha256 by relative name where the caller has them already)."""
    problems = Problems()
    expectations = DocumentExpectations(spec)
    per_file: dict[str, int] = {}
    lines: dict[str, int] = {}
    with RawCopyWriter(out, labelled=bool(class_names_of(spec))) as writer:
        documents = read_documents(spec.source, files, root, problems, per_file, lines)
        written = write_documents(spec, documents, writer, expectations, problems)
    if expectations.documents == 0:
        problems.add(f"the corpus holds no documents ({len(files)} file(s) read: {_first_names(files, root)})")
    report = report_of(spec, expectations, problems, len(files))
    sources = describe(files, root, per_file, hashes)
    record = None
    if report.passed:
        record = corpus_record(key, sources, lines, files, root, written, out)
    return TextRawData(path=out, rows=written.rows, report=report, sources=sources,
                       how=f"every document read ({expectations.documents}): {why}", record=record)


def report_of(spec: PipelineSpec, expectations: DocumentExpectations, problems: Problems, files: int):
    from assets.quality.runner import QualityReport

    return QualityReport(f"{spec.name}/raw_dataset", expectations.finish(files), problems.listed())


def corpus_record(key: dict | None, sources: list[dict], lines: dict[str, int], files: list[Path], root: Path,
                  written: Written, raw: Path) -> dict:
    """The record of a passed ingest (every document accepted, so the raw copy's row groups are
    its chunks): what proves a later corpus is this one grown, and what resumes its checks. One
    that cannot be built on says why in ``not_appendable``."""
    links = [relative_name(f, root) for f in files if f.is_symlink()]
    why = ("no data key" if key is None else
           f"{links[0]} is a symbolic link, whose target may change unseen" if links else None)
    if why:
        return {"version": RECORD_VERSION, "not_appendable": why}
    paths = {relative_name(f, root): f for f in files}
    described = []
    for entry in sources:
        entry = dict(entry)
        if entry["file"].endswith(".jsonl"):
            entry.update(lines=lines.get(entry["file"], 0), ends_line=ends_line(paths[entry["file"]]))
        described.append(entry)
    return {"version": RECORD_VERSION, "parameters": key["parameters"], "code": key["code"], "files": described,
            "documents": written.rows, "row_groups": pq.ParquetFile(raw).num_row_groups, "tail": written.tail,
            "expectations": written.before_tail}


def ends_line(path: Path) -> bool:
    """Whether the file ends with a line end: then a line appended after it starts a line."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def _chunks(documents: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while chunk := list(islice(documents, size)):
        yield chunk


def _acceptable(spec: PipelineSpec, chunk: list[Document], problems: Problems) -> list[Document]:
    """The documents of ``chunk`` whose length and label are right; the others' problems recorded."""
    kept = []
    for document in chunk:
        problem = document_problem(spec, document)
        if problem:
            problems.add(problem)
        else:
            kept.append(document)
    return kept


def _first_names(files: list[Path], root: Path) -> str:
    names = sorted(relative_name(f, root) for f in files)
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def describe(files: list[Path], root: Path, per_file: dict[str, int], hashes: dict[str, str] | None = None
             ) -> list[dict]:
    """What raw_dataset records about each file read (a symbolic link as the link, not followed);
    a file's sha256 from ``hashes`` when there (the data key's, computed from the same bytes)."""
    out = []
    for f in sorted(files, key=lambda p: relative_name(p, root)):
        rel = relative_name(f, root)
        entry = {"file": rel, "bytes": f.lstat().st_size, "documents": per_file.get(rel, 0)}
        if f.is_symlink():
            entry["link"] = str(f.readlink())
        elif f.is_file():
            entry["sha256"] = (hashes or {}).get(rel) or file_sha256(f)
        out.append(entry)
    return out


class RawCopyWriter:
    """documents.parquet, one row group per chunk of accepted documents."""

    def __init__(self, path: Path, labelled: bool):
        # each text's sha256 (its 32 bytes, of the UTF-8 text) is what a part's key is made of: kept
        # here so the shards' plan reads ids, hashes and labels, not every text. They come first
        # and the texts last, so in each row group the plan's columns lie together and one range
        # reads them (pyarrow joins ranges with small holes; a text column between them would be
        # read whenever it is small)
        fields = [("id", pa.string()), (TEXT_SHA256, pa.binary(32))]
        fields += [("label", pa.string())] if labelled else []
        self.schema = pa.schema([*fields, ("chars", pa.int64()), ("text", pa.large_string())])
        self.labelled = labelled
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")

    def write(self, documents: list[Document]) -> None:
        if not documents:
            return
        columns = {"id": [d.id for d in documents],
                   TEXT_SHA256: [hashlib.sha256(d.text.encode()).digest() for d in documents]}
        if self.labelled:
            columns["label"] = [d.label for d in documents]
        columns["chars"] = [len(d.text) for d in documents]
        columns["text"] = [d.text for d in documents]
        self._writer.write_table(pa.Table.from_pydict(columns, schema=self.schema), row_group_size=len(documents))

    def __enter__(self) -> "RawCopyWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._writer.close()
