"""Reading a text corpus: documents from JSONL files (one JSON object a line) and plain ``.txt``
files (one document each), and every problem that keeps a file or a line out, named by file,
line and byte.

Files are read one line (JSONL) or one document (.txt) at a time, and a line or a document is
refused before it is read whole when it is larger than ``max_chars`` characters could make it, so
one bad file cannot take the memory the chunked ingest keeps bounded.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from core.spec import TextCorpus

SUFFIXES = (".jsonl", ".txt")
# A JSON string escapes an astral character as two \uXXXX escapes: 12 bytes for one character.
JSON_BYTES_PER_CHAR = 12
JSON_LINE_SLACK = 1 << 20  # room for a line's other fields beside its text
UTF8_BYTES_PER_CHAR = 4
MAX_LISTED_PROBLEMS = 50  # the report lists this many and counts the rest


@dataclass(frozen=True)
class Document:
    id: str  # "<file>:<line>" for a JSONL line, "<file>" for a .txt file (paths relative to the root)
    file: str
    text: str
    label: str | None  # as written in the source (JSON numbers as their text); None when absent


class Problems:
    """Every problem found, counted; the first ``MAX_LISTED_PROBLEMS`` kept as messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.count = 0

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.messages) < MAX_LISTED_PROBLEMS:
            self.messages.append(message)

    def listed(self) -> list[str]:
        more = self.count - len(self.messages)
        return self.messages + ([f"... and {more} more problem(s) of the same kinds"] if more else [])


def relative_name(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def read_documents(source: TextCorpus, files: list[Path], root: Path, problems: Problems,
                   documents_per_file: dict[str, int], lines_per_file: dict[str, int] | None = None
                   ) -> Iterator[Document]:
    """Every readable document of ``files``, files in order of their path under ``root`` and lines
    in file order: the order of the raw copy and of the token stream. ``lines_per_file`` gets each
    JSONL file's lines read (blank ones too): where lines appended to it later are numbered from."""
    for rel, path in sorted((relative_name(f, root), f) for f in files):
        documents_per_file[rel] = 0
        target = _readable_target(path, root, rel, problems)
        if target is None:
            continue
        if path.suffix not in SUFFIXES:
            problems.add(f"{rel}: the extension {path.suffix or '(none)'!r} is neither .jsonl nor .txt; "
                         "the text corpus reads JSONL (one JSON object a line) and plain .txt files")
            continue
        size = target.stat().st_size
        if size == 0:
            problems.add(f"{rel}: the file is empty (0 bytes)")
            continue
        if path.suffix == ".jsonl":
            documents = _jsonl_documents(target, rel, source, problems, lines=lines_per_file)
        else:
            documents = _txt_document(target, rel, source, problems)
        for document in documents:
            documents_per_file[rel] += 1
            yield document


def read_appended_lines(source: TextCorpus, path: Path, rel: str, start: int, lines_before: int,
                        problems: Problems, documents_per_file: dict[str, int],
                        lines_per_file: dict[str, int]) -> Iterator[Document]:
    """The documents of the lines appended to the JSONL file ``path`` after its first ``start``
    bytes, which held ``lines_before`` lines ending with a line end: numbered, offset and refused
    as a whole read of the file numbers, offsets and refuses them (assets/kinds/text_append.py)."""
    documents_per_file.setdefault(rel, 0)
    for document in _jsonl_documents(path, rel, source, problems, lines=lines_per_file, start=start,
                                     lines_before=lines_before):
        documents_per_file[rel] += 1
        yield document


def _readable_target(path: Path, root: Path, rel: str, problems: Problems) -> Path | None:
    """The file to read; a symbolic link only when it leads to a file under the root."""
    if not path.is_symlink():
        return path
    target = path.resolve()
    if not target.is_relative_to(root.resolve()):
        problems.add(f"{rel}: a symbolic link to {target}, outside the sources root; copy the file in instead")
        return None
    if not target.is_file():
        problems.add(f"{rel}: a symbolic link to {target}, which is not a file")
        return None
    return target


def _txt_document(path: Path, rel: str, source: TextCorpus, problems: Problems) -> Iterator[Document]:
    size = path.stat().st_size
    if size > UTF8_BYTES_PER_CHAR * source.max_chars:
        problems.add(f"{rel}: {size:,} bytes, more than max_chars={source.max_chars:,} characters can take "
                     "(not read)")
        return
    data = path.read_bytes()
    text = _decoded(data, rel, 0, problems)
    if text is not None:
        yield Document(id=rel, file=rel, text=text.removeprefix("\ufeff"), label=None)


def _decoded(data: bytes, where: str, file_offset: int, problems: Problems, after: str = "") -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
        problems.add(f"{where}: not UTF-8: byte {file_offset + exc.start:,} of the file (0x{bad:02x}): "
                     f"{exc.reason}; save the file as UTF-8{after}")
        return None


def _jsonl_documents(path: Path, rel: str, source: TextCorpus, problems: Problems, *,
                     lines: dict[str, int] | None = None, start: int = 0, lines_before: int = 0) -> Iterator[Document]:
    limit = JSON_BYTES_PER_CHAR * source.max_chars + JSON_LINE_SLACK
    offset = start
    if lines is not None:
        lines[rel] = lines_before
    with open(path, "rb") as f:
        f.seek(start)
        for number, line, size in _bounded_lines(f, limit, lines_before):
            if lines is not None:
                lines[rel] = number
            where = f"{rel} line {number}"
            start, offset = offset, offset + size
            if line is None:
                problems.add(f"{where}: {size:,} bytes, more than a document of max_chars={source.max_chars:,} "
                             "characters can take (not read)")
                continue
            if start == 0 and line.startswith(codecs.BOM_UTF8):
                line, start = line[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
            text = _decoded(line, where, start, problems, after=" (its later lines are not read)")
            if text is None:
                return  # one encoding problem stands for the whole file
            if not text.strip():
                continue  # blank lines (a trailing newline, spacing) hold no document
            document = _json_document(text, where, f"{rel}:{number}", rel, source, problems)
            if document is not None:
                yield document


def _bounded_lines(f: BinaryIO, limit: int, number: int = 0) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number from ``number`` + 1, the line's bytes or None when it is longer than ``limit``,
    its size)."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) <= limit or line.endswith(b"\n"):
            yield number, line, len(line)
            continue
        size = len(line)
        while not line.endswith(b"\n"):  # skip the rest of the overlong line without holding it
            line = f.readline(1 << 20)
            if not line:
                break
            size += len(line)
        yield number, None, size


def _json_document(text: str, where: str, doc_id: str, rel: str, source: TextCorpus,
                   problems: Problems) -> Document | None:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        problems.add(f"{where}: not JSON ({exc.msg}, column {exc.colno})")
        return None
    if not isinstance(record, dict):
        problems.add(f"{where}: a JSON {_json_type(record)}, not an object; write one object a line, "
                     f"e.g. {{\"{source.text_field}\": \"...\"}}")
        return None
    if source.text_field not in record:
        problems.add(f"{where}: no text field {source.text_field!r} (fields: {sorted(record)[:10]})")
        return None
    body = record[source.text_field]
    if not isinstance(body, str):
        problems.add(f"{where}: text field {source.text_field!r} is a JSON {_json_type(body)}, not a string")
        return None
    label = record.get(source.label_field) if source.label_field else None
    return Document(id=doc_id, file=rel, text=body, label=_label_text(label))


def _label_text(label) -> str | None:
    """A label as the declared class names spell it (``classes=range(3)`` declares "0", "1", "2")."""
    if label is None:
        return None
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        return json.dumps(label)  # refused by the class check, shown as written
    return str(label)


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")
