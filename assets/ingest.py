"""The raw dataset asset's work: the source, chunk by chunk, through the raw suite and the
platform's rules into one Parquet file, and that file read back in batches by the shards asset.

Memory is bounded by a chunk: each one is validated by Great Expectations (``ChunkedRawSuite``),
converted to canonical types (``validate_frame``) and appended to the Parquet file as a row
group. Only ids (for the uniqueness rule across chunks) and the suite's key columns are kept
for the whole source.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from assets.quality import QualityReport
from assets.quality.chunked import ChunkedRawSuite
from assets.source import SourceError, validate_frame
from assets.spec import PipelineSpec


def dataset_prefix(dataset: str) -> str:
    return f"datasets/{dataset}/"


def raw_path(dataset: str) -> str:
    return dataset_prefix(dataset) + "raw/data.parquet"


@dataclass(frozen=True)
class Ingested:
    report: QualityReport  # the raw suite, plus the platform's own rules as extra failures
    rows: int
    columns: int  # columns of the source as parsed (first chunk)
    path: Path  # the validated rows as Parquet; meaningful only when report.passed


def ingest_chunks(spec: PipelineSpec, asset: str, suite: Mapping[str, Sequence[Any]] | None,
                  chunks: Iterable[pd.DataFrame], out: Path) -> Ingested:
    """Validate the chunks and write the accepted rows to ``out``. A chunk the platform's rules
    refuse stops the writing, but every chunk still goes through the suite so the report is whole.
    ``suite=None`` applies the platform's rules alone (benchmarks use it to time the data path)."""
    checker = ChunkedRawSuite(asset, suite, spec.feature_columns, spec.label_column) if suite is not None else None
    writer = _ParquetAppender(out, [spec.label_column])
    error: str | None = None
    ids: list[np.ndarray] = []
    columns = None
    rows = 0
    try:
        for chunk in chunks:
            columns = len(chunk.columns) if columns is None else columns
            rows += len(chunk)
            if checker is not None:
                checker.add(chunk)
            if error is None and len(chunk):
                try:
                    valid = validate_frame(spec, chunk)
                except SourceError as exc:
                    error = str(exc)
                    continue
                if spec.id_column:
                    ids.append(valid[spec.id_column].to_numpy(dtype=str))
                writer.append(valid)
    finally:
        writer.close()
    if error is None and rows == 0:
        error = f"pipeline {spec.name!r}: the source has no rows (header only or empty)"
    if error is None and spec.id_column:
        error = _duplicate_ids(spec, ids)
    report = checker.finish() if checker is not None else QualityReport(asset, [])
    return Ingested(report=report.with_failure(error), rows=rows, columns=columns or 0, path=out)


def _duplicate_ids(spec: PipelineSpec, parts: list[np.ndarray]) -> str | None:
    """The rule ``validate_frame`` applies within a chunk, across all of them."""
    if len(parts) < 2:
        return None
    ids = np.sort(np.concatenate(parts))
    dup = np.nonzero(ids[1:] == ids[:-1])[0]
    if not len(dup):
        return None
    return (f"pipeline {spec.name!r}: id column {spec.id_column!r} has {len(dup)} duplicate id(s), "
            f"e.g. {str(ids[dup[0]])!r}; ids must be unique")


class _ParquetAppender:
    """Row groups appended to one Parquet file, all in the first chunk's schema. Dictionary
    encoding only for ``dictionary_columns`` (labels): on float features it costs three quarters
    of the write time and saves nothing."""

    def __init__(self, path: Path, dictionary_columns: Sequence[str] = ()):
        self.path, self._writer, self._schema = path, None, None
        self._dictionary = list(dictionary_columns)

    def append(self, frame: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self.path, self._schema, use_dictionary=self._dictionary)
        self._writer.write_table(table.cast(self._schema))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def iter_raw_arrays(spec: PipelineSpec, path: Path, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """The raw Parquet file in batches of ``rows``: (features float32, label texts, ids or None)."""
    import pyarrow.parquet as pq

    cols = list(spec.feature_columns)
    wanted = cols + [spec.label_column] + ([spec.id_column] if spec.id_column else [])
    for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=rows, columns=wanted):
        features = np.empty((batch.num_rows, len(cols)), dtype=np.float32)
        for j, col in enumerate(cols):  # column by column: no float64 or pandas copy of the batch
            features[:, j] = batch.column(col).to_numpy()
        yield (features, batch.column(spec.label_column).to_numpy(zero_copy_only=False).astype(str),
               batch.column(spec.id_column).to_numpy(zero_copy_only=False).astype(str) if spec.id_column else None)
