"""A Parquet file that keeps another's first row groups as bytes and adds row groups after them:
the file one ``ParquetWriter`` writes when given the kept row groups' rows and then the new ones.

A Parquet file is ``PAR1``, its row groups' column chunks one after another, and a footer (Thrift
``FileMetaData``: the schema, each row group's column chunks with their pages' byte offsets and
statistics, the key-value metadata), its length and ``PAR1``. A row group's bytes depend only on
its rows and the writer's settings, and where it lies only on the row groups before it: so the
kept row groups lie, byte for byte, where a writer given every row puts them, and ``splice``
copies them instead of decoding and encoding them again. The new row groups are written by the
same writer to a file of their own and copied after them, their offsets in its footer moved by
where they now lie. The footer is then that file's ``FileMetaData`` with the kept row groups
before its own (ordinals renumbered, rows summed); the Thrift compact encoding below writes
fields and lists as Thrift's C++ ``TCompactProtocol`` does, which is checked on every footer read
(it must encode back to its own bytes). Anything else in the two footers (schema, key-value
metadata, the writer's name) must be equal, and neither file may hold page indexes or bloom
filters (a writer puts those after all row groups), or ``SpliceError`` says what differs.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"PAR1"
# field ids of parquet.thrift: FileMetaData, RowGroup, ColumnChunk, ColumnMetaData
_NUM_ROWS, _ROW_GROUPS = 3, 4
_RG_COLUMNS, _RG_NUM_ROWS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 3, 5, 7
_CC_FILE_OFFSET, _CC_META, _CC_OFFSET_INDEX, _CC_COLUMN_INDEX = 2, 3, 4, 6
_CM_DATA_PAGE, _CM_INDEX_PAGE, _CM_DICTIONARY_PAGE, _CM_BLOOM_FILTER = 9, 10, 11, 14
# Thrift compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class SpliceError(Exception):
    """The files' footers are not ones this splice can join as a writer would."""


def splice(published: Path, keep: int, added: Path | None, out: Path) -> None:
    """Write ``out``: ``published``'s first ``keep`` row groups as they are, then ``added``'s (None:
    none), with the footer one writer of all their rows gives."""
    with open(published, "rb") as f:
        footer, footer_start = _read_footer(f)
    groups = _field(footer, _ROW_GROUPS)[1]
    if keep > len(groups):
        raise SpliceError(f"{published.name} has {len(groups)} row groups, not {keep}")
    # the kept row groups end where the next one starts, or where the footer starts
    end = _row_group_start(groups[keep]) if keep < len(groups) else footer_start
    written, new, new_end = footer, [], len(MAGIC)
    if added is not None:
        with open(added, "rb") as f:
            written, new_end = _read_footer(f)
        new = [_shifted(g, end - len(MAGIC)) for g in _field(written, _ROW_GROUPS)[1]]
    encoded = _encode_struct(_merged(footer, groups[:keep] + new, written))
    with open(out, "wb") as dst:
        with open(published, "rb") as src:
            _copy(src, dst, end)
        if added is not None:
            with open(added, "rb") as src:
                src.seek(len(MAGIC))
                _copy(src, dst, new_end - len(MAGIC))
        dst.write(encoded + struct.pack("<i", len(encoded)) + MAGIC)


def join(parts: list[Path], out: Path) -> None:
    """Write ``out``: every row group of ``parts``, in order, as bytes, with the footer one writer of
    all their rows gives (each part written by the same writer settings and schema: a source's
    groups of files ingested by steps of their own, assets/table_ingest_steps.py). One part is
    copied as it is."""
    if not parts:
        raise SpliceError("no parts to join")
    footers, ends = [], []
    for part in parts:
        with open(part, "rb") as f:
            footer, end = _read_footer(f)
        footers.append(footer)
        ends.append(end)
    groups, at = [], len(MAGIC)  # where the next part's row groups start in ``out``
    for footer, end in zip(footers, ends):
        groups += [_shifted(g, at - len(MAGIC)) for g in _field(footer, _ROW_GROUPS)[1]]
        at += end - len(MAGIC)
    for footer in footers[1:]:
        _merged(footers[0], [], footer)  # refuses footers that differ but in their row groups
    encoded = _encode_struct(_merged(footers[0], groups, footers[-1]))
    with open(out, "wb") as dst:
        dst.write(MAGIC)
        for part, end in zip(parts, ends):
            with open(part, "rb") as src:
                src.seek(len(MAGIC))
                _copy(src, dst, end - len(MAGIC))
        dst.write(encoded + struct.pack("<i", len(encoded)) + MAGIC)


def _read_footer(f: BinaryIO) -> tuple[list, int]:
    """(the file's FileMetaData decoded, where it starts)."""
    end = f.seek(-8, 2)
    tail = f.read(8)
    if tail[4:] != MAGIC:
        raise SpliceError(f"{getattr(f, 'name', 'a file')} is not a Parquet file (no PAR1 at its end)")
    length = struct.unpack("<i", tail[:4])[0]
    f.seek(end - length)
    raw = f.read(length)
    footer = _decode_struct(_Reader(raw))
    if _encode_struct(footer) != raw:  # the encoding below would not write this footer as its writer did
        raise SpliceError(f"{getattr(f, 'name', 'a file')}'s footer does not encode back to the same bytes")
    for group in _field(footer, _ROW_GROUPS)[1]:
        for chunk in _field(group, _RG_COLUMNS)[1]:
            if _field(chunk, _CC_OFFSET_INDEX) or _field(chunk, _CC_COLUMN_INDEX) or \
                    _field(_field(chunk, _CC_META), _CM_BLOOM_FILTER):
                raise SpliceError(f"{getattr(f, 'name', 'a file')} holds page indexes or bloom filters")
    return footer, end - length


def _row_group_start(group: list) -> int:
    """Where a row group's first column chunk starts: its dictionary page, else its first data page."""
    meta = _field(_field(group, _RG_COLUMNS)[1][0], _CC_META)
    dictionary = _field(meta, _CM_DICTIONARY_PAGE)
    return dictionary if dictionary is not None else _field(meta, _CM_DATA_PAGE)


def _shifted(group: list, by: int) -> list:
    """A row group's metadata with every byte offset in it moved by ``by`` (0 stays: not set)."""
    def meta(fields: list) -> list:
        return [(i, t, v + by if i in (_CM_DATA_PAGE, _CM_INDEX_PAGE, _CM_DICTIONARY_PAGE) and v else v)
                for i, t, v in fields]

    def chunk(fields: list) -> list:
        return [(i, t, v + by if i == _CC_FILE_OFFSET and v else meta(v) if i == _CC_META else v)
                for i, t, v in fields]

    return [(i, t, v + by if i == _RG_FILE_OFFSET and v else (v[0], [chunk(c) for c in v[1]]) if i == _RG_COLUMNS
             else v) for i, t, v in group]


def _merged(published: list, groups: list, written: list) -> list:
    """``written``'s footer holding ``groups`` (renumbered, their rows summed); the rest of
    ``published``'s must be the same."""
    if _without(published) != _without(written):
        differ = sorted({i for i, _, _ in _without(published)} ^ {i for i, _, _ in _without(written)} |
                        {i for (i, t, v) in _without(published) if (i, t, v) not in _without(written)})
        raise SpliceError(f"the footers differ in FileMetaData field(s) {differ} (the schema, metadata or writer)")
    groups = [[(i, t, n if i == _RG_ORDINAL else v) for i, t, v in g] for n, g in enumerate(groups)]
    rows = sum(_field(g, _RG_NUM_ROWS) for g in groups)
    return [(i, t, rows if i == _NUM_ROWS else (v[0], groups) if i == _ROW_GROUPS else v) for i, t, v in written]


def _without(footer: list) -> list:
    return [f for f in footer if f[0] not in (_NUM_ROWS, _ROW_GROUPS)]


def _field(fields: list, fid: int) -> Any:
    return next((value for i, _, value in fields if i == fid), None)


def _copy(src: BinaryIO, dst: BinaryIO, n: int) -> None:
    left = n
    while left:
        block = src.read(min(8 << 20, left))
        if not block:
            raise SpliceError(f"{getattr(src, 'name', 'a file')} ended before byte {n}")
        dst.write(block)
        left -= len(block)


# -- Thrift compact protocol: decode to (field id, type, value) lists and encode them back ------------

class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _decode_struct(r: _Reader) -> list:
    fields, last = [], 0
    while True:
        header = r.byte()
        if header == 0:
            return fields
        t, delta = header & 0x0F, header >> 4
        fid = last + delta if delta else _unzigzag(r.varint())
        fields.append((fid, t, None if t in (_TRUE, _FALSE) else _decode_value(r, t)))
        last = fid


def _decode_value(r: _Reader, t: int) -> Any:
    if t in (_I16, _I32, _I64):
        return _unzigzag(r.varint())
    if t == _BYTE:
        return r.byte()
    if t == _BINARY:
        return r.take(r.varint())
    if t == _DOUBLE:
        return r.take(8)
    if t == _STRUCT:
        return _decode_struct(r)
    if t in (_LIST, _SET):
        header = r.byte()
        size, elem = header >> 4, header & 0x0F
        if size == 15:
            size = r.varint()
        return (elem, [r.byte() if elem in (_TRUE, _FALSE) else _decode_value(r, elem) for _ in range(size)])
    raise SpliceError(f"a Thrift value of type {t}, which Parquet footers do not hold")


def _encode_struct(fields: list) -> bytes:
    out, last = bytearray(), 0
    for fid, t, value in fields:
        if last < fid <= last + 15:
            out.append(((fid - last) << 4) | t)
        else:
            out.append(t)
            out += _varint(_zigzag(fid))
        if t not in (_TRUE, _FALSE):
            out += _encode_value(t, value)
        last = fid
    out.append(0)
    return bytes(out)


def _encode_value(t: int, value: Any) -> bytes:
    if t in (_I16, _I32, _I64):
        return _varint(_zigzag(value))
    if t == _BYTE:
        return bytes([value])
    if t == _BINARY:
        return _varint(len(value)) + value
    if t == _DOUBLE:
        return value
    if t == _STRUCT:
        return _encode_struct(value)
    elem, items = value
    head = bytes([(len(items) << 4) | elem]) if len(items) <= 14 else bytes([0xF0 | elem]) + _varint(len(items))
    return head + b"".join(bytes([v]) if elem in (_TRUE, _FALSE) else _encode_value(elem, v) for v in items)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7
