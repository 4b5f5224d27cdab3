"""A CSV source parsed by Arrow's multi-threaded reader, piece by piece, into the frames pandas'
reader would have given.

pandas' C parser runs on one core. Arrow's ``read_csv`` parses a buffer's blocks on every core
and hands each column over as one buffer, so the feature matrix is copied once, not
interleaved through a 256-block frame and cast again. It reads a whole input at once, so the
file is cut into pieces of about ``PIECE_BYTES`` at line ends (outside quotes) and each piece is
parsed on its own: memory holds a piece and a chunk, never the file. Side by side on the
benchmarks' 27 MB, 258-column CSV (7 alternated rounds, medians, 2 cores): 8 MB pieces 0.113 s,
one ``read_csv`` of the whole file 0.110 s, Arrow's streaming reader 0.144 s (it parses one
block while converting the previous one), pandas 0.37 s.

Arrow fixes each column's type from the first piece (its inference there, then those types for
every later piece), where pandas infers them again for every chunk. So this reader is used only
where the two agree, and says so when they would not (``ArrowFallback``): before the first chunk
when the header or the first piece's types look different from pandas' (duplicate or empty
names, dates, times, decimals, ids that read as floats), and mid-way when a later piece no
longer fits the first one's types (a feature that is not a number, integers that turn to
fractions, ids that turn from numbers to text, a column empty at first and filled later, a
malformed row). The caller then reads the
source again with pandas, whose chunks show the offending values to the suite and the
platform's rules as before. Within the first piece Arrow infers as pandas does (int64, float64,
bool, text); nulls are pandas' default ``na_values``, empty text is null, and a column empty in
every row of the first piece is float64 NaN, all as in pandas.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from core.spec import PipelineSpec

# at most 8 MB (as fast as the whole file at once, above; 32 MB pieces took 0.16 s), and no more
# than a chunk's worth of text (``Source.chunk_mb``: a parsed cell's 8 bytes are about its text's)
PIECE_BYTES = 8 << 20
_PLAIN_TYPES = ("int64", "double", "string", "large_string", "bool", "null")


class ArrowFallback(Exception):
    """Arrow's reader would not give what pandas' gives for this file; read it with pandas."""


def piece_bytes(spec: PipelineSpec) -> int:
    """The size of the pieces a file is parsed in (``PIECE_BYTES``, less for small chunks)."""
    return int(min(PIECE_BYTES, max(1 << 20, spec.source.chunk_mb * 2**20)))


def applies(spec: PipelineSpec, path: Path) -> bool:
    """Arrow reads CSV files of pipelines that set no pandas ``csv_options`` (those have no
    Arrow equivalent here)."""
    return path.suffix.lower() in (".csv", ".txt") and not spec.source.csv_options


def _pandas_null_values() -> list[str]:
    from pandas._libs.parsers import STR_NA_VALUES  # pandas' default na_values

    return sorted(STR_NA_VALUES)


def arrow_frames(spec: PipelineSpec, path: Path, rows: int, seen: dict | None = None) -> Iterator[pd.DataFrame]:
    """The file as pandas would parse it, ``rows`` rows at a time (the last chunk fewer); a frame's
    columns share Arrow's buffers. Raises ``ArrowFallback`` where pandas' reader is needed
    instead (see the module's docstring). ``seen`` receives the types the first piece fixed
    (``fixed_types``): what an append to this file is parsed with (``appended_frames``)."""
    with open(path, "rb") as f:
        header = f.readline()
        if header.count(b'"') % 2:
            raise ArrowFallback(f"{path.name}: the header's quotes span lines")
        names = _names(path, header)
        reader = _PieceReader(spec, path, names)
        total = 0
        for frame in _chunked(reader.tables(f), reader, rows, rows):
            if seen is not None and not seen:
                seen.update(fixed_types(reader, len(header)))
            total += len(frame)
            yield frame
        if not total:  # header only: pandas gives its columns as text
            raise ArrowFallback(f"{path.name}: no rows")


def _chunked(tables, reader: _PieceReader, first: int, rows: int) -> Iterator[pd.DataFrame]:
    """The pieces' rows as frames of ``first`` rows, then ``rows`` each (the last fewer)."""
    import pyarrow as pa

    pending: list = []
    held, size = 0, first
    for table in tables:
        pending.append(table)
        held += table.num_rows
        while held >= size:
            joined = pa.concat_tables(pending)
            yield _frame(joined.slice(0, size), reader.nulls)
            pending, held, size = [joined.slice(size)], held - size, rows
    if held:
        yield _frame(pa.concat_tables(pending), reader.nulls)


def fixed_types(reader: _PieceReader, header_bytes: int) -> dict:
    """What a file's first piece fixed, as JSON: the column types, the all-null columns, and how
    many bytes that piece was cut from (an append leaves the piece as it was only when the old
    file held at least that many bytes after its header)."""
    return {"types": {name: str(t) for name, t in reader.types.items()}, "nulls": list(reader.nulls),
            "piece_bytes": reader.piece_bytes, "header_bytes": header_bytes}


def appended_frames(spec: PipelineSpec, path: Path, start: int, fixed: dict, first: int,
                    rows: int) -> Iterator[pd.DataFrame]:
    """The rows of ``path`` from byte ``start`` on (a line start), parsed with the types the
    published version's first piece fixed (``fixed_types``), in frames of ``first`` rows, then
    ``rows``: the frames a parse of the whole file gives for those rows, since every piece after
    the first is parsed with the first one's types. A value that does not fit them raises
    ``ArrowFallback``, as it does mid-way through the whole file."""
    import pyarrow as pa

    with open(path, "rb") as f:
        names = _names(path, f.readline())
        reader = _PieceReader(spec, path, names)
        reader.types = {name: pa.type_for_alias(t) for name, t in fixed["types"].items()}
        reader.nulls, reader._fixed = list(fixed["nulls"]), True
        f.seek(start)
        yield from _chunked(reader.tables(f), reader, first, rows)


def _names(path: Path, header: bytes) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        names = pacsv.read_csv(pa.py_buffer(header)).schema.names
    except pa.ArrowInvalid as exc:
        raise ArrowFallback(f"{path.name}: {exc}") from exc
    if len(set(names)) != len(names) or not all(names):
        raise ArrowFallback(f"{path.name}: duplicate or empty column names (pandas renames them)")
    return names


class _PieceReader:
    """Parses the pieces of one file: the first with Arrow's inference, the later ones with the
    first one's types."""

    def __init__(self, spec: PipelineSpec, path: Path, names: list[str]):
        self.spec, self.path, self.names = spec, path, names
        self.types: dict = {}  # inferred in the first piece
        self.nulls: list[str] = []  # columns empty in the first piece: float64 NaN, as pandas has them
        self._fixed = False
        self.piece_bytes = piece_bytes(spec)

    def tables(self, f: BinaryIO) -> Iterator:
        for piece, quoted in _pieces(f, self.piece_bytes):
            table = self._parse(piece, quoted)
            if not self._fixed:
                self._check(table.schema)
                self.types = {field.name: field.type for field in table.schema}
                self._fixed = True
            yield table

    def _parse(self, piece: memoryview, quoted: bool):
        import pyarrow as pa
        import pyarrow.csv as pacsv

        try:
            return pacsv.read_csv(
                pa.py_buffer(piece),
                read_options=pacsv.ReadOptions(column_names=self.names, use_threads=True),
                # a quoted value may hold a line end: Arrow must then not cut blocks at every one
                parse_options=pacsv.ParseOptions(newlines_in_values=quoted),
                convert_options=pacsv.ConvertOptions(column_types=self.types, strings_can_be_null=True,
                                                     null_values=_pandas_null_values(), timestamp_parsers=[]))
        except pa.ArrowInvalid as exc:  # a value that does not fit the first piece's types, or a bad row
            raise ArrowFallback(f"{self.path.name}: {exc}") from exc

    def _check(self, schema) -> None:
        odd = [f"{f.name}: {f.type}" for f in schema if str(f.type) not in _PLAIN_TYPES]
        if odd:
            raise ArrowFallback(f"{self.path.name}: column types pandas does not infer: {odd[:3]}")
        types = {f.name: str(f.type) for f in schema}
        text = [c for c in self.spec.feature_columns if types.get(c, "int64") not in ("int64", "double", "null")]
        if text:  # a bad value: pandas shows it in its own chunk only, where Arrow's piece would hide it
            raise ArrowFallback(f"{self.path.name}: feature column(s) {text[:3]} do not read as numbers")
        idc = self.spec.id_column
        if idc in schema.names and str(schema.field(idc).type) == "double":
            # pandas may hold such ids as uint64 (past int64) where Arrow gives floats: other text
            raise ArrowFallback(f"{self.path.name}: id column {idc!r} reads as floats")
        self.nulls = [f.name for f in schema if str(f.type) == "null"]


def _pieces(f: BinaryIO, size: int) -> Iterator[tuple[memoryview, bool]]:
    """The rest of ``f`` in pieces of about ``size`` bytes, each ending at a line end that lies
    outside quotes (an even number of quote characters before it: RFC 4180 doubles a quote
    inside a quoted value, which keeps the count even), and whether the piece holds a quote.
    Each piece is read whole at its own offset (the partial line after a cut is read again with
    the next piece) rather than joined to the previous read's tail, which would copy it."""
    start = f.tell()
    while True:
        f.seek(start)
        data = f.read(size)
        if not data:
            return
        cut = len(data) if len(data) < size else _line_end(data)  # the last piece: its last line may have no end
        while cut == 0:  # a line longer than a piece: read on, doubling, to its end
            more = f.read(len(data))
            data += more
            cut = _line_end(data) if more else len(data)
        if cut > 256 or data[:cut].strip():  # trailing blank lines (longer runs parse to no rows)
            yield memoryview(data)[:cut], data.find(b'"', 0, cut) >= 0
        start += cut


def _line_end(buf: bytes) -> int:
    """Just past the last line end of ``buf`` outside quotes; 0 if there is none."""
    end = buf.rfind(b"\n")
    if b'"' not in buf:
        return end + 1
    while end >= 0 and buf.count(b'"', 0, end) % 2:
        end = buf.rfind(b"\n", 0, end)
    return end + 1


def _frame(table, nulls: list[str]) -> pd.DataFrame:
    import pyarrow as pa

    for name in nulls:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, pa.field(name, pa.float64()), table.column(i).cast(pa.float64()))
    return table.to_pandas(split_blocks=True)
