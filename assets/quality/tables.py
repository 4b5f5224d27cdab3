"""The tables the suites validate: the raw source as parsed, and the shards read back from the store."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from assets.sharding import SPLITS, decode_shard


def label_text(value) -> str:
    """3, 3.0 and "3" name the same class (CSV readers disagree on which they produce)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def raw_tables(feature_columns, label_column: str, frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``rows``: the source exactly as parsed; ``features``: every declared feature cell as a
    (column, value) row, so one expectation covers all feature columns and still names the column
    that broke it; ``classes``: one row per label with its share."""
    return {**chunk_tables(feature_columns, frame),
            "classes": classes_table(label_counts(label_column, frame), len(frame))}


def chunk_tables(feature_columns, frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The ``rows`` and ``features`` tables of one frame (the whole source, or one chunk of it)."""
    present = [c for c in feature_columns if c in frame.columns]
    if present and len(frame):
        features = frame[present].melt(var_name="column", value_name="value")
        # one small code per cell instead of the column's name: the table has rows x columns rows
        # (melt stacks whole columns in order, so the codes are known without hashing the names)
        features["column"] = pd.Categorical.from_codes(
            np.repeat(np.arange(len(present), dtype=np.int32), len(frame)), categories=present)
    else:
        features = pd.DataFrame({"column": pd.Series(dtype=str), "value": pd.Series(dtype="float64")})
    return {"rows": frame, "features": features}


def label_counts(label_column: str, frame: pd.DataFrame) -> pd.Series:
    """Rows per label text in ``frame`` (none when it lacks the label column)."""
    if label_column not in frame.columns or not len(frame):
        return pd.Series(dtype="int64")
    return frame[label_column].dropna().map(label_text).value_counts()


def classes_table(counts: pd.Series, rows: int) -> pd.DataFrame:
    """One row per label with its count and its share of all ``rows`` source rows."""
    if not len(counts):
        return pd.DataFrame({"label": pd.Series(dtype=str), "count": pd.Series(dtype="int64"),
                             "share": pd.Series(dtype="float64")})
    return pd.DataFrame({"label": counts.index.astype(str), "count": counts.to_numpy(),
                         "share": counts.to_numpy() / rows})


def shard_tables(store, ref: str, prefix: str, manifest: dict) -> dict[str, pd.DataFrame]:
    """``samples``: one row per sample decoded from the shard files at ``ref`` (label, finiteness,
    largest absolute normalised feature); ``splits``: counts and fractions per split."""
    shape = tuple(manifest["feature_shape"])
    parts, split_rows = [], []
    total = sum(s["num_samples"] for s in manifest["splits"].values())
    for split in SPLITS:
        info = manifest["splits"].get(split, {"num_samples": 0, "shards": []})
        checksums_ok = True
        for entry in info["shards"]:
            data = store.get_object(ref, prefix + entry["path"])
            checksums_ok &= hashlib.sha256(data).hexdigest() == entry["sha256"]
            features, labels = decode_shard(data, entry["num_samples"], shape)
            flat = features.reshape(len(labels), -1).astype(np.float64)
            finite = np.isfinite(flat).all(axis=1)
            with np.errstate(invalid="ignore"):
                max_abs = np.where(finite, np.abs(np.nan_to_num(flat, posinf=0, neginf=0)).max(axis=1), np.inf)
            parts.append(pd.DataFrame({"split": split, "label": labels.astype(np.int64), "finite": finite,
                                       "max_abs": max_abs}))
        expected = manifest["split"]["fractions"][split]
        fraction = info["num_samples"] / total if total else 0.0
        split_rows.append({"split": split, "num_samples": info["num_samples"], "fraction": fraction,
                           "expected_fraction": expected, "fraction_error": abs(fraction - expected),
                           "checksums_ok": bool(checksums_ok)})
    samples = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"split": pd.Series(dtype=str), "label": pd.Series(dtype="int64"), "finite": pd.Series(dtype=bool),
         "max_abs": pd.Series(dtype="float64")})
    samples["train_label"] = samples["label"].where(samples["split"] == "train")
    return {"samples": samples, "splits": pd.DataFrame(split_rows)}
