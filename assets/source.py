"""Reading a pipeline's source files, refusing what training cannot use.

The raw asset reads them in chunks (``iter_source_chunks``) so that a source larger than memory
can be ingested; ``load_frame`` reads one whole for callers that want a frame.
Great Expectations suites (assets/quality) check the data further; the rules here are the ones
without which the data cannot even be stored: files exist, parse, hold the columns and rows.
"""

from __future__ import annotations

import glob
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from core.spec import PipelineSpec


class SourceError(ValueError):
    """The source data cannot be ingested; the message says what is wrong and how to fix it."""


def missing_source_hint(spec: PipelineSpec) -> str:
    """How to put a pipeline's missing source files where it reads them (pipelines/sources.py)."""
    hint = f"commit them with `python -m pipelines sources add {spec.name} FILE...`"
    if spec.location == "platform":  # the platform's own example pipelines ship their data's writer
        hint += "; the platform's example data is written by `python -m pipelines sources examples`"
    return hint


def resolve_source_files(spec: PipelineSpec, sources_root: Path, patterns: tuple[str, ...] | None = None) -> list[Path]:
    """The files of the source's paths (``patterns``: of these only), relative ones under ``sources_root``."""
    files: list[Path] = []
    for pattern in spec.source.paths if patterns is None else patterns:
        p = Path(pattern)
        full = p if p.is_absolute() else sources_root / p
        matches = sorted(Path(m) for m in glob.glob(str(full)))
        if not matches:
            raise SourceError(
                f"pipeline {spec.name!r}: source {str(full)!r} matches no file; "
                f"put the CSV/Parquet files there or fix the pipeline's source paths; or {missing_source_hint(spec)}"
            )
        files.extend(m for m in matches if m.is_file())
    if not files:
        raise SourceError(f"pipeline {spec.name!r}: the source paths match only directories, no files")
    return files


class SourceChunks:
    """The files' rows as parsed, at most ``rows`` at a time, in file order. Iterating reads them
    with pandas (CSV through its chunked C reader with the pipeline's csv_options, Parquet by
    row batches). Every file yields at least one frame, so a header-only file still shows its
    columns to the schema checks. ``fast()`` reads CSV files with Arrow's multi-threaded reader
    where it gives what pandas gives (assets/arrow_csv.py); it raises ``ArrowFallback`` where
    it would not, and the raw asset then reads the source again by iterating."""

    def __init__(self, spec: PipelineSpec, files: list[Path], rows: int):
        self.spec, self.files, self.rows = spec, list(files), rows
        self.fixed: dict[int, dict] = {}  # file index -> the types Arrow's first piece fixed (``fast``)

    def __iter__(self) -> Iterator[pd.DataFrame]:
        return _source_chunks(self.spec, self.files, self.rows, arrow=False)

    def fast(self) -> Iterator[pd.DataFrame] | None:
        """The chunks with Arrow reading the CSV files it applies to; None when it applies to none."""
        from assets import arrow_csv

        if not any(arrow_csv.applies(self.spec, path) for path in self.files):
            return None
        self.fixed = {}
        return _source_chunks(self.spec, self.files, self.rows, arrow=True, fixed=self.fixed)


def iter_source_chunks(spec: PipelineSpec, files: list[Path], rows: int) -> SourceChunks:
    """The files' chunks (``SourceChunks``)."""
    return SourceChunks(spec, files, rows)


def iter_file_chunks(spec: PipelineSpec, path: Path, rows: int, *, arrow: bool, fixed: dict) -> Iterator[pd.DataFrame]:
    """One file's chunks as ``SourceChunks`` gives them within a source of many (``arrow``: as
    ``fast()`` does; ``fixed[0]`` then receives the types Arrow's first piece fixed). A file is
    parsed on its own, its types from it alone, and its last chunk is not joined to the next
    file's first: so a file added to a source is ingested alone (assets/append.py)."""
    return _source_chunks(spec, [path], rows, arrow=arrow, fixed=fixed)


def _source_chunks(spec: PipelineSpec, files: list[Path], rows: int, arrow: bool,
                   fixed: dict[int, dict] | None = None) -> Iterator[pd.DataFrame]:
    from assets import arrow_csv

    for i, path in enumerate(files):
        suffix = path.suffix.lower()
        if path.stat().st_size == 0:
            raise SourceError(f"source file {path.name!r} is empty (0 bytes)")
        if suffix not in (".parquet", ".pq", ".csv", ".txt"):
            raise SourceError(f"source file {path.name!r}: unsupported type {suffix!r}; use .csv or .parquet")
        if arrow and arrow_csv.applies(spec, path):
            yield from arrow_csv.arrow_frames(spec, path, rows, None if fixed is None else fixed.setdefault(i, {}))
            continue
        try:
            if suffix in (".parquet", ".pq"):
                import pyarrow.parquet as pq

                source = pq.ParquetFile(path)
                chunks: Iterable[pd.DataFrame] = (
                    b.to_pandas() for b in source.iter_batches(batch_size=rows))
                empty = source.schema_arrow.empty_table().to_pandas()
            else:
                chunks = pd.read_csv(path, chunksize=rows, **spec.source.csv_options)
                empty = None
            any_rows = False
            for chunk in chunks:
                any_rows = True
                yield chunk
            if not any_rows:
                yield empty if empty is not None else pd.read_csv(path, nrows=0, **spec.source.csv_options)
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError, OSError, ValueError) as exc:
            raise SourceError(f"source file {path.name!r} cannot be parsed: {type(exc).__name__}: {exc}") from exc


def iter_frame_chunks(frame: pd.DataFrame, rows: int) -> Iterator[pd.DataFrame]:
    """A loader's frame in the same chunks (at least one, so an empty frame shows its columns)."""
    for start in range(0, max(1, len(frame)), rows):
        yield frame.iloc[start:start + rows]


def read_source(spec: PipelineSpec, files: list[Path]) -> pd.DataFrame:
    """The files as one frame (``iter_source_chunks``' chunks put together)."""
    return pd.concat(iter_source_chunks(spec, files, spec.chunk_rows), ignore_index=True)


def load_frame(spec: PipelineSpec, sources_root: Path) -> tuple[pd.DataFrame, list[dict]]:
    """The source as one frame plus a description of each file it came from."""
    if spec.source.loader is not None:
        frame = spec.source.loader()
        described = [{"loader": spec.source.describe(), "rows": int(len(frame))}]
    else:
        files = resolve_source_files(spec, sources_root)
        frame = read_source(spec, files)
        described = [{"file": f.name, "bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in files]
    return validate_frame(spec, frame), described


# (features float32 2-D, targets, ids or None). Targets by task: label texts (classification),
# float64 values (regression), uint8 0/1 of shape (rows, labels) (multilabel).
Arrays = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


def validate_frame(spec: PipelineSpec, frame: pd.DataFrame) -> pd.DataFrame:
    """Keep the pipeline's columns in canonical types; refuse frames training cannot use."""
    fast = _numeric_arrays(spec, frame)
    if fast is None:
        return _validate_frame(spec, frame)
    features, targets, ids = fast
    out = pd.DataFrame(features, columns=list(spec.feature_columns))
    if spec.task == "multilabel":
        for i, column in enumerate(spec.label_columns):
            out[column] = targets[:, i]
    else:
        out[spec.label_column] = targets
    if ids is not None:
        out[spec.id_column] = ids
    return out


def validated_arrays(spec: PipelineSpec, frame: pd.DataFrame) -> Arrays:
    """``validate_frame``'s rules and messages, returning arrays instead of a frame (what the
    raw copy stores): the common case builds no frame of 256 float32 columns at all."""
    fast = _numeric_arrays(spec, frame)
    if fast is not None:
        return fast
    out = _validate_frame(spec, frame)
    targets = out[list(spec.label_columns)].to_numpy(dtype=np.uint8) if spec.task == "multilabel" \
        else out[spec.label_column].to_numpy()
    return (out[list(spec.feature_columns)].to_numpy(dtype=np.float32), targets,
            out[spec.id_column].to_numpy() if spec.id_column else None)


def _numeric_arrays(spec: PipelineSpec, frame: pd.DataFrame) -> Arrays | None:
    """The common case vectorised: every feature column already numeric and nothing to refuse.
    Returns None for anything else, which ``_validate_frame`` then converts or refuses with its
    messages. One float64 conversion of all features replaces a per-column ``pd.to_numeric``
    and 256-column ``__setitem__`` (30-40 % of source-to-shards time in a py-spy profile)."""
    from pandas.api.types import is_numeric_dtype

    cols = list(spec.feature_columns)
    wanted = cols + list(spec.target_columns) + ([spec.id_column] if spec.id_column else [])
    if len(frame) == 0 or any(c not in frame.columns for c in wanted) or \
            not all(is_numeric_dtype(frame[c].dtype) for c in cols):
        return None
    # column by column into the float32 matrix: one copy, where a float64 matrix and its cast
    # were two (finiteness is judged on the float64 values, as _validate_frame judges it)
    x = np.empty((len(frame), len(cols)), dtype=np.float32)
    for j, c in enumerate(cols):
        values = frame[c].to_numpy(dtype=np.float64, na_value=np.nan)
        if not np.isfinite(values).all():
            return None
        with np.errstate(over="ignore"):  # past float32's range is inf, as astype gave it: the shard gate refuses it
            x[:, j] = values
    ids = frame[spec.id_column] if spec.id_column else None
    if ids is not None and (ids.isna().any() or ids.duplicated().any()):
        return None
    targets = _numeric_targets(spec, frame)
    if targets is None:
        return None
    return x, targets, None if ids is None else ids.astype(str).to_numpy()


def _numeric_targets(spec: PipelineSpec, frame: pd.DataFrame) -> np.ndarray | None:
    """``_numeric_arrays``' targets, or None when a rule may refuse them (``_targets`` then says why)."""
    from pandas.api.types import is_numeric_dtype

    if spec.task == "regression":
        column = frame[spec.label_column]
        if not is_numeric_dtype(column.dtype):
            return None
        y = column.to_numpy(dtype=np.float64, na_value=np.nan)
        if not np.isfinite(y).all() or (spec.target_range is not None and len(_outside(spec, y))):
            return None
        return y
    if spec.task == "multilabel":
        cols = list(spec.label_columns)
        if not all(is_numeric_dtype(frame[c].dtype) for c in cols):
            return None
        y = frame[cols].to_numpy(dtype=np.float64, na_value=np.nan)
        if not ((y == 0) | (y == 1)).all():
            return None
        return y.astype(np.uint8)
    labels = frame[spec.label_column]
    if labels.isna().any():
        return None
    text = labels.map(_label_text).astype(str)
    if not set(text.unique()) <= set(spec.class_names):
        return None
    return text.to_numpy()


def _validate_frame(spec: PipelineSpec, frame: pd.DataFrame) -> pd.DataFrame:
    if len(frame) == 0:
        raise SourceError(f"pipeline {spec.name!r}: the source has no rows (header only or empty)")
    wanted = list(spec.feature_columns) + list(spec.target_columns) + ([spec.id_column] if spec.id_column else [])
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise SourceError(
            f"pipeline {spec.name!r}: the source lacks column(s) {shown} "
            f"(it has {len(frame.columns)} columns: {', '.join(map(str, list(frame.columns)[:8]))}...); "
            "fix the source or the pipeline's feature/label columns"
        )
    out = frame[wanted].copy()
    features = out[list(spec.feature_columns)]
    try:
        numeric = features.apply(pd.to_numeric, errors="raise").astype(np.float64)
    except (ValueError, TypeError) as exc:
        bad = [c for c in spec.feature_columns if pd.to_numeric(out[c], errors="coerce").isna().any()
               and not out[c].isna().all()]
        raise SourceError(
            f"pipeline {spec.name!r}: feature column(s) {bad[:5]} hold non-numeric values; "
            "features must be numbers"
        ) from exc
    values = numeric.to_numpy()
    if not np.isfinite(values).all():
        cols = [c for c, ok in zip(spec.feature_columns, np.isfinite(values).all(axis=0)) if not ok]
        raise SourceError(
            f"pipeline {spec.name!r}: feature column(s) {cols[:5]} hold missing, NaN or infinite values"
        )
    out[list(spec.feature_columns)] = numeric.astype(np.float32)
    if spec.task == "regression":
        out[spec.label_column] = _regression_targets(spec, out)
    elif spec.task == "multilabel":
        for column, values in _multilabel_targets(spec, out).items():
            out[column] = values
    else:
        out[spec.label_column] = _class_labels(spec, out[spec.label_column])
    if spec.id_column:
        if out[spec.id_column].isna().any():
            raise SourceError(f"pipeline {spec.name!r}: id column {spec.id_column!r} has missing values")
        dupes = out[spec.id_column][out[spec.id_column].duplicated()]
        if len(dupes):
            raise SourceError(
                f"pipeline {spec.name!r}: id column {spec.id_column!r} has {len(dupes)} duplicate id(s), "
                f"e.g. {dupes.iloc[0]!r}; ids must be unique"
            )
        out[spec.id_column] = out[spec.id_column].astype(str)
    return out.reset_index(drop=True)


def _class_labels(spec: PipelineSpec, labels: pd.Series) -> pd.Series:
    if labels.isna().any():
        raise SourceError(f"pipeline {spec.name!r}: label column {spec.label_column!r} has missing values")
    labels = labels.map(_label_text)
    unknown = sorted(set(labels) - set(spec.class_names))
    if unknown:
        raise SourceError(
            f"pipeline {spec.name!r}: label(s) {unknown[:5]} in column {spec.label_column!r} are outside the known "
            f"classes {list(spec.class_names)}; fix the data or add the class to the pipeline"
        )
    return labels.astype(str)


def _regression_targets(spec: PipelineSpec, frame: pd.DataFrame) -> np.ndarray:
    """The label column as float64; refuses text, missing, NaN and infinite values, and values
    outside the declared ``target_range``."""
    column = spec.label_column
    raw = frame[column]
    numbers = pd.to_numeric(raw, errors="coerce")
    text = numbers.isna() & raw.notna() & ~raw.map(_is_nan)
    if text.any():
        raise SourceError(f"pipeline {spec.name!r}: label column {column!r} holds {int(text.sum())} non-numeric "
                          f"value(s), e.g. {_shown(raw[text].iloc[0])}{_where(spec, frame, text)}; regression "
                          "targets must be numbers")
    y = numbers.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(y)
    if bad.any():
        raise SourceError(f"pipeline {spec.name!r}: label column {column!r} holds {int(bad.sum())} missing, NaN or "
                          f"infinite value(s){_where(spec, frame, bad)}; regression targets must be finite numbers: "
                          "fix or drop those rows")
    outside = _outside(spec, y)
    if len(outside):
        low, high = spec.target_range
        raise SourceError(f"pipeline {spec.name!r}: label column {column!r} holds {len(outside)} value(s) outside "
                          f"target_range [{low:g}, {high:g}], e.g. {y[outside[0]]:g}"
                          f"{_where(spec, frame, outside)}; fix the data or widen the pipeline's target_range")
    return y


def _outside(spec: PipelineSpec, y: np.ndarray) -> np.ndarray:
    """Positions of targets outside the declared (inclusive) ``target_range``."""
    if spec.target_range is None:
        return np.array([], dtype=np.int64)
    low, high = spec.target_range
    return np.flatnonzero((y < low) | (y > high))


def _multilabel_targets(spec: PipelineSpec, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each label column as uint8 0/1; refuses missing values and anything but 0 and 1 (True and
    False count as 1 and 0), naming every column that breaks the rule."""
    problems, out = [], {}
    for column in spec.label_columns:
        raw = frame[column]
        numbers = pd.to_numeric(raw, errors="coerce").astype(np.float64)
        missing = raw.isna().to_numpy() | raw.map(_is_nan).to_numpy()
        wrong = ~missing & ~numbers.isin([0.0, 1.0]).to_numpy()
        if missing.any():
            problems.append(f"label column {column!r} has {int(missing.sum())} missing value(s)"
                            f"{_where(spec, frame, missing)}")
        if wrong.any():
            problems.append(f"label column {column!r} holds {int(wrong.sum())} value(s) other than 0 and 1, e.g. "
                            f"{_shown(raw[wrong].iloc[0])}{_where(spec, frame, wrong)}")
        out[column] = numbers.fillna(0).to_numpy().astype(np.uint8)
    if problems:
        raise SourceError(f"pipeline {spec.name!r}: " + "; ".join(problems) + "; a multi-label column holds 0 or 1 "
                          "(or True/False) in every row")
    return out


def _where(spec: PipelineSpec, frame: pd.DataFrame, rows: np.ndarray) -> str:
    """`` (id 'x')`` naming the first of the given rows (a mask or positions), when the source has ids."""
    if not spec.id_column or spec.id_column not in frame.columns:
        return ""
    positions = np.flatnonzero(rows) if rows.dtype == bool else rows
    return f" (id {str(frame[spec.id_column].iloc[int(positions[0])])!r})" if len(positions) else ""


def _shown(value) -> str:
    """A source value as a message shows it: 2, not np.int64(2)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _is_nan(v) -> bool:
    return isinstance(v, (float, np.floating)) and v != v


def _label_text(v) -> str:
    # 3 and 3.0 and "3" name the same class; CSV readers disagree on which they produce.
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
