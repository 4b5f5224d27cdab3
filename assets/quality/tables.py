"""The tables the suites validate: the raw source as parsed, and the shards read back from the store."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from assets.sharding import SPLITS, decode_shard
from training_runtime.data.shard_format import FORMAT_V2, NORMALISE_ON_READ, ShardColumns, columns_from_manifest


def label_text(value) -> str:
    """3, 3.0 and "3" name the same class (CSV readers disagree on which they produce)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def raw_tables(feature_columns, label_column: str, frame: pd.DataFrame, *, task: str = "classification",
               label_columns: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """``rows``: the source exactly as parsed; ``features``: every declared feature cell as a
    (column, value) row, so one expectation covers all feature columns and still names the column
    that broke it; ``targets``: the same for a multi-label table's 0/1 cells; ``classes``: one row
    per class with its share (multi-label: per label, its positive rows; regression: empty)."""
    tables = chunk_tables(feature_columns, frame, label_columns if task == "multilabel" else ())
    if task == "multilabel":
        tables["classes"] = positives_table(positive_counts(label_columns, frame), len(frame), label_columns)
    elif task == "regression":
        tables["classes"] = classes_table(pd.Series(dtype="int64"), len(frame))
    else:
        tables["classes"] = classes_table(label_counts(label_column, frame), len(frame))
    return tables


def chunk_tables(feature_columns, frame: pd.DataFrame, target_columns: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """The ``rows``, ``features`` and ``targets`` tables of one frame (the whole source, or one chunk
    of it); ``targets`` holds the cells of ``target_columns`` (a multi-label table's 0/1 columns)."""
    return {"rows": frame, "features": long_table(feature_columns, frame, "float64"),
            "targets": long_table(target_columns, frame, "int64")}


def long_table(columns, frame: pd.DataFrame, empty_dtype: str) -> pd.DataFrame:
    """Every cell of ``columns`` in ``frame`` as a (column, value) row."""
    present = [c for c in columns if c in frame.columns]
    if not (present and len(frame)):
        return pd.DataFrame({"column": pd.Series(dtype=str), "value": pd.Series(dtype=empty_dtype)})
    # one small code per cell instead of the column's name: the table has rows x columns rows
    # (melt stacks whole columns in order, so the codes are known without hashing the names)
    codes = pd.Categorical.from_codes(np.repeat(np.arange(len(present), dtype=np.int32), len(frame)),
                                      categories=present)
    kinds = {frame[c].dtype for c in present}
    if kinds <= {np.dtype(np.float64), np.dtype(np.int64)}:
        # plain numbers: the columns' values one after another are melt's "value" (int64 and
        # float64 together give float64, as melt gives), without melt's repeated column names
        # (rows x columns strings, which a chunk under a memory limit could not allocate)
        values = np.concatenate([frame[c].to_numpy() for c in present])
        return pd.DataFrame({"column": codes, "value": values}, copy=False)
    cells = frame[present].melt(var_name="column", value_name="value")
    cells["column"] = codes
    return cells


def label_counts(label_column: str, frame: pd.DataFrame) -> pd.Series:
    """Rows per label text in ``frame`` (none when it lacks the label column)."""
    if label_column not in frame.columns or not len(frame):
        return pd.Series(dtype="int64")
    return frame[label_column].dropna().map(label_text).value_counts()


def positive_counts(label_columns: Sequence[str], frame: pd.DataFrame) -> pd.Series:
    """Rows holding 1 in each multi-label column of ``frame`` (0 for a column it lacks)."""
    counts = {c: int((pd.to_numeric(frame[c], errors="coerce") == 1).sum()) if c in frame.columns else 0
              for c in label_columns}
    return pd.Series(counts, dtype="int64")


def classes_table(counts: pd.Series, rows: int) -> pd.DataFrame:
    """One row per label with its count and its share of all ``rows`` source rows."""
    if not len(counts):
        return pd.DataFrame({"label": pd.Series(dtype=str), "count": pd.Series(dtype="int64"),
                             "share": pd.Series(dtype="float64")})
    return pd.DataFrame({"label": counts.index.astype(str), "count": counts.to_numpy(),
                         "share": counts.to_numpy() / rows})


def positives_table(counts: pd.Series, rows: int, label_columns: Sequence[str]) -> pd.DataFrame:
    """A multi-label table's ``classes``: one row per label column, absent ones included, with its
    positive rows and their share. The name is also in ``column``, which reports of failed
    expectations list, so a label never present is named."""
    names = list(label_columns)
    count = np.array([int(counts.get(c, 0)) for c in names], dtype=np.int64)
    return pd.DataFrame({"label": names, "column": names, "count": count,
                         "share": count / rows if rows else np.zeros(len(names))})


def shard_tables(store, ref: str, prefix: str, manifest: dict) -> dict[str, pd.DataFrame]:
    """The shards at ``ref`` read back: ``samples``, one row per sample (split, finiteness, largest
    absolute normalised feature, and the target as the task has it); ``splits``: counts, fractions
    and checksums per split; for multi-label shards ``labels``: positives per label."""
    if manifest.get("format") == FORMAT_V2:
        return _target_shard_tables(store, ref, prefix, manifest)
    shape = tuple(manifest["feature_shape"])
    norm = _read_normalisation(manifest)
    parts, checksums = [], {}
    for split in SPLITS:
        info = manifest["splits"].get(split, {"num_samples": 0, "shards": []})
        checksums_ok = True
        for entry in info["shards"]:
            data = store.get_object(ref, prefix + entry["path"])
            checksums_ok &= hashlib.sha256(data).hexdigest() == entry["sha256"]
            features, labels = decode_shard(data, entry["num_samples"], shape)
            parts.append(pd.DataFrame({"split": split, "label": labels.astype(np.int64),
                                       **_feature_figures(features, len(labels), norm)}))
        checksums[split] = checksums_ok
    samples = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"split": pd.Series(dtype=str), "label": pd.Series(dtype="int64"), "finite": pd.Series(dtype=bool),
         "max_abs": pd.Series(dtype="float64")})
    samples["train_label"] = samples["label"].where(samples["split"] == "train")
    return {"samples": samples, "splits": _split_table(manifest, checksums)}


def _read_normalisation(manifest: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The (mean, std) a reader applies to shards that hold the source's values, as the manifest
    says them: non-finite figures (a source with non-finite values) make non-finite samples, which
    the checks report, where the trainer's reader would refuse the manifest."""
    if not manifest.get(NORMALISE_ON_READ):
        return None
    norm = manifest["normalisation"]
    return np.asarray(norm["mean"], dtype=np.float32), np.asarray(norm["std"], dtype=np.float32)


def _feature_figures(features: np.ndarray, n: int, norm: tuple[np.ndarray, np.ndarray] | None = None
                     ) -> dict[str, np.ndarray]:
    """Per sample: whether every feature is finite, and the largest absolute (finite) feature, as
    the trainer reads it (``norm``: the (mean, std) a reader applies to shards that hold the
    source's values)."""
    flat = features.reshape(n, -1)
    if norm is not None:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            flat = (flat - norm[0]) / norm[1]
    flat = flat.astype(np.float64)
    finite = np.isfinite(flat).all(axis=1)
    with np.errstate(invalid="ignore"):
        max_abs = np.where(finite, np.abs(np.nan_to_num(flat, posinf=0, neginf=0)).max(axis=1, initial=0.0), np.inf)
    return {"finite": finite, "max_abs": max_abs}


def _split_table(manifest: dict, checksums: dict[str, bool]) -> pd.DataFrame:
    total = sum(s["num_samples"] for s in manifest["splits"].values())
    rows = []
    for split in SPLITS:
        count = manifest["splits"].get(split, {"num_samples": 0})["num_samples"]
        expected = manifest["split"]["fractions"][split]
        fraction = count / total if total else 0.0
        rows.append({"split": split, "num_samples": count, "fraction": fraction, "expected_fraction": expected,
                     "fraction_error": abs(fraction - expected), "checksums_ok": bool(checksums[split])})
    return pd.DataFrame(rows)


def _target_shard_tables(store, ref: str, prefix: str, manifest: dict) -> dict[str, pd.DataFrame]:
    """``shard_tables`` of a v2 table (regression or multi-label targets). Each shard file is copied
    from the store to a temporary file and read the way the trainer reads it
    (``training_runtime.data.shard_format.ShardColumns``); one at a time, so memory holds one shard."""
    columns = columns_from_manifest(manifest)
    norm = _read_normalisation(manifest)
    multilabel = manifest["task"] == "multilabel"
    names = list(manifest.get("target_names") or [])
    positives = {split: np.zeros(len(names), dtype=np.int64) for split in SPLITS}
    parts, checksums = [], {}
    with tempfile.TemporaryDirectory(prefix="shard-check-") as tmp:
        for split in SPLITS:
            info = manifest["splits"].get(split, {"num_samples": 0, "shards": []})
            checksums_ok = True
            for i, entry in enumerate(info["shards"]):
                path = store.download(ref, prefix + entry["path"], Path(tmp) / f"{split}-{i:05d}.bin")
                checksums_ok &= _sha256(path) == entry["sha256"]
                shard = ShardColumns(path, entry, columns)
                n = shard.num_samples
                table = {"split": split, **_feature_figures(shard.arrays["features"], n, norm)}
                target = np.asarray(shard.arrays["target"], dtype=np.float64)
                if multilabel:
                    table["target_binary"] = ((target == 0) | (target == 1)).all(axis=1)
                    positives[split] += (target == 1).sum(axis=0).astype(np.int64)
                else:
                    table["target"] = target
                    table["target_finite"] = np.isfinite(target)
                parts.append(pd.DataFrame(table))
                del shard, target  # closes the memory map before the file goes
                path.unlink()
            checksums[split] = checksums_ok
    samples = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"split": pd.Series(dtype=str), "finite": pd.Series(dtype=bool), "max_abs": pd.Series(dtype="float64")})
    tables = {"samples": samples, "splits": _split_table(manifest, checksums)}
    if multilabel:
        tables["labels"] = pd.DataFrame({"column": names, "train_positives": positives["train"],
                                         "positives": sum(positives.values())})
    return tables


def untrained_labels(tables: dict[str, pd.DataFrame]) -> str | None:
    """In plain words, the multi-label columns with no positive row in the training split (a rule of
    the platform, whatever the pipeline's suite says): a model cannot learn a label it never sees."""
    labels = tables.get("labels")
    if labels is None:
        return None
    absent = labels[labels["train_positives"] < 1]
    if not len(absent):
        return None
    elsewhere = dict(zip(absent["column"], absent["positives"].astype(int).tolist()))
    return (f"label column(s) {list(absent['column'])} hold no 1 in the train split (rows holding 1 in the other "
            f"splits: {elsewhere}); add training rows where the label is 1, or drop it from the pipeline's labels")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
