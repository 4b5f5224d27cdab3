"""Proposed change for assets/source.py + assets/sharding.py (measured here, applied by their
owner): raw source -> shards in bounded memory, with the same shards as
``build_shards(load_frame(...))``.

Today ``load_frame`` reads every file whole with ``pandas.read_csv`` and ``build_shards`` holds the
frame, a float32 copy, a normalised copy and one masked copy per split: peak memory grows with
the source (about 5x its float32 size). Here:

1. the source is read ``chunk_rows`` rows at a time and each chunk validated by the platform's
   ``validate_frame``; features go to a float32 scratch file on disk, ids and labels stay in memory
   (tens of bytes per row);
2. ids are sorted (the platform's order) and checked for duplicates over the whole source;
3. normalisation is fitted on the train split with the same arithmetic as numpy's ``mean``/``std``
   (sequential float64 sums in sorted order), so the result is bit-identical;
4. each split's shards are gathered from the memory-mapped scratch file and written as they fill.

Only file-backed pages (reclaimable page cache) grow with the source; anonymous memory is bounded
by ``chunk_rows`` and ``samples_per_shard`` plus the per-row ids.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from assets.sharding import MANIFEST_FORMAT, SPLITS, Normalisation, assign_splits, encode_shard
from assets.source import SourceError, _label_text, validate_frame
from assets.spec import PipelineSpec


def validated_arrays(spec: PipelineSpec, chunk: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(features float32, label texts, id texts or None) of a chunk, with ``validate_frame``'s
    rules. The happy path is vectorised (one float64 conversion of all feature columns instead of
    a per-column ``pd.to_numeric``); anything it does not accept goes through ``validate_frame``,
    which raises the platform's own message (or, for e.g. numeric strings, converts them)."""
    from pandas.api.types import is_numeric_dtype

    cols = list(spec.feature_columns)
    wanted = cols + [spec.label_column] + ([spec.id_column] if spec.id_column else [])
    fast = len(chunk) > 0 and all(c in chunk.columns for c in wanted) and \
        all(is_numeric_dtype(chunk[c].dtype) for c in cols)
    if fast:
        x = chunk[cols].to_numpy(dtype=np.float64)
        labels = chunk[spec.label_column]
        ids = chunk[spec.id_column] if spec.id_column else None
        fast = bool(np.isfinite(x).all()) and not labels.isna().any() and (ids is None or not ids.isna().any())
    if fast:
        text = labels.map(_label_text).astype(str)
        fast = set(text.unique()) <= set(spec.class_names) and (ids is None or not ids.duplicated().any())
    if not fast:
        frame = validate_frame(spec, chunk)
        return (frame[cols].to_numpy(dtype=np.float32), frame[spec.label_column].to_numpy(),
                frame[spec.id_column].to_numpy() if spec.id_column else None)
    return x.astype(np.float32), text.to_numpy(), None if ids is None else ids.astype(str).to_numpy()


def iter_source_chunks(spec: PipelineSpec, files: list[Path], chunk_rows: int) -> Iterator[tuple]:
    """Validated chunks ``(features, label texts, ids)`` of the source files (CSV through pandas'
    chunked C reader with the pipeline's csv_options, Parquet by row batches), in file order."""
    for path in files:
        if path.stat().st_size == 0:
            raise SourceError(f"source file {path.name!r} is empty (0 bytes)")
        suffix = path.suffix.lower()
        try:
            if suffix in (".parquet", ".pq"):
                import pyarrow.parquet as pq

                chunks: Iterable[pd.DataFrame] = (
                    b.to_pandas() for b in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows))
            elif suffix in (".csv", ".txt"):
                chunks = pd.read_csv(path, chunksize=chunk_rows, **spec.source.csv_options)
            else:
                raise SourceError(f"source file {path.name!r}: unsupported type {suffix!r}; use .csv or .parquet")
            for chunk in chunks:
                yield validated_arrays(spec, chunk)
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise SourceError(f"source file {path.name!r} cannot be parsed: {type(exc).__name__}: {exc}") from exc


def _sequential_sum(acc: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """acc + rows[0] + rows[1] + ... in that order (numpy's axis-0 reduction order)."""
    stacked = np.concatenate([acc[None, :], rows], axis=0)
    return np.cumsum(stacked, axis=0)[-1]


def build_shards_chunked(
    spec: PipelineSpec, files: list[Path], *, out_dir: Path, seed: int,
    fractions: tuple[float, float, float], samples_per_shard: int, chunk_rows: int = 8192,
    scratch_dir: str | None = None,
) -> dict:
    """The manifest and shards of ``build_shards(load_frame(spec, ...)[0], ...)``, in bounded memory."""
    dim = math.prod(spec.shape)
    feature_cols = list(spec.feature_columns)
    label_index = {name: i for i, name in enumerate(spec.class_names)}
    with tempfile.TemporaryDirectory(prefix="shards-scratch-", dir=scratch_dir) as scratch:
        scratch_path = Path(scratch) / "features.f32"
        ids_parts, label_parts = [], []
        n = 0
        with open(scratch_path, "wb") as f:
            for feats, texts, chunk_ids in iter_source_chunks(spec, files, chunk_rows):
                f.write(np.ascontiguousarray(feats).tobytes())
                if spec.id_column:
                    ids_parts.append(chunk_ids.astype(str))
                else:
                    hashed = pd.DataFrame(feats, columns=feature_cols)
                    hashed[spec.label_column] = texts
                    ids_parts.append(pd.util.hash_pandas_object(hashed, index=False).astype(str).to_numpy())
                label_parts.append(pd.Series(texts).astype(str).map(label_index).to_numpy(dtype=np.int64))
                n += len(feats)
        if n == 0:
            raise SourceError(f"pipeline {spec.name!r}: the source has no rows (header only or empty)")
        ids = np.concatenate(ids_parts)
        labels_src = np.concatenate(label_parts)
        del ids_parts, label_parts
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        if spec.id_column and len(ids) > 1:
            dup = np.nonzero(ids[1:] == ids[:-1])[0]
            if len(dup):
                raise SourceError(
                    f"pipeline {spec.name!r}: id column {spec.id_column!r} has {len(dup)} duplicate id(s), "
                    f"e.g. {ids[dup[0]]!r}; ids must be unique")
        split_of = assign_splits(pd.Series(ids), seed, fractions)
        del ids
        for code, split in enumerate(SPLITS):
            if not (split_of == code).any():
                raise ValueError(
                    f"the {split} split is empty ({n} rows in all): add data or change the split fractions")
        feats = np.memmap(scratch_path, dtype=np.float32, mode="r", shape=(n, dim))
        train_rows = order[split_of == 0]
        norm = _fit_normalisation(feats, train_rows, chunk_rows)
        splits = {}
        for code, split in enumerate(SPLITS):
            rows = order[split_of == code]
            (out_dir / split).mkdir(parents=True, exist_ok=True)
            entries = []
            for i, start in enumerate(range(0, len(rows), samples_per_shard)):
                sel = rows[start:start + samples_per_shard]
                data = encode_shard(norm.apply(feats[sel]), labels_src[sel])
                rel = f"{split}/{i:05d}.bin"
                (out_dir / rel).write_bytes(data)
                entries.append({"path": rel, "num_samples": len(sel),
                                "sha256": hashlib.sha256(data).hexdigest(), "num_bytes": len(data)})
            splits[split] = {"num_samples": int(len(rows)), "shards": entries}
        del feats
    return {
        "format": MANIFEST_FORMAT,
        "feature_shape": list(spec.shape),
        "feature_dtype": "float32",
        "label_dtype": "int64",
        "num_classes": len(spec.class_names),
        "class_names": list(spec.class_names),
        "samples_per_shard": samples_per_shard,
        "normalisation": norm.to_dict(),
        "split": {"seed": seed, "fractions": dict(zip(SPLITS, fractions)), "by": spec.id_column or "row content hash"},
        "splits": splits,
    }


def _fit_normalisation(feats: np.ndarray, rows: np.ndarray, chunk_rows: int) -> Normalisation:
    """``Normalisation.fit(feats[rows])`` without materialising ``feats[rows]``: numpy's mean and
    std over axis 0 in float64 are sequential row sums, reproduced chunk by chunk."""
    dim = feats.shape[1]
    total = np.zeros(dim, dtype=np.float64)
    for s in range(0, len(rows), chunk_rows):
        total = _sequential_sum(total, feats[rows[s:s + chunk_rows]].astype(np.float64))
    mean = total / len(rows)
    sq = np.zeros(dim, dtype=np.float64)
    for s in range(0, len(rows), chunk_rows):
        d = feats[rows[s:s + chunk_rows]].astype(np.float64) - mean
        sq = _sequential_sum(sq, d * d)
    std = np.sqrt(sq / len(rows))
    std[std < 1e-12] = 1.0
    return Normalisation(mean=mean.astype(np.float32), std=std.astype(np.float32))
