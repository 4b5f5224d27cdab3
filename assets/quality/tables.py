"""The tables the suites validate: the raw source as parsed, and the shards read back from the store
(those a version kept from the previous one counted by their parts' summaries where the suite allows)."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from assets.quality.placement import placement
from assets.sharding import CARRIED, SPLITS, SUMMARY, decode_shard
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


@dataclass(frozen=True)
class ShardTables:
    """The tables the shard suite validates, what was read to make them, and the plain failures
    found on the way (a shard whose bytes are not its manifest entry's, named)."""

    tables: dict[str, pd.DataFrame]
    read: int  # shard files read back from the store
    summarised: int  # kept shard files counted by their parts' summaries instead
    why_read_kept: str | None  # why kept shards were read back all the same (None: they were not)
    failures: list[str]


def shard_tables(store, ref: str, prefix: str, manifest: dict, suite: Mapping[str, Sequence[Any]] | None = None
                 ) -> ShardTables:
    """The shards at ``ref`` read back: ``samples``, one row per sample (split, finiteness, largest
    absolute normalised feature, and the target as the task has it); ``splits``: counts, fractions
    and checksums per split; for multi-label shards ``labels``: positives per label.

    Given the ``suite`` they are for, shards the manifest marks ``CARRIED`` (kept from the version
    this one builds on) are not read back when every expectation on ``samples`` can be judged from
    their parts' summaries (``summarisable``): each such part stands in ``samples`` as a few rows,
    one per (split, label) it holds, carrying its extremes under this version's normalisation. The
    kept files were read back and checked when they were written, by the same suite and code (both
    are in the part's key), and the trainer verifies each one's sha256 as it fetches it."""
    kept, why = _summarised_parts(manifest, suite)
    skip = {path for part in kept for info in part["splits"].values() for path in info["shards"]}
    if manifest.get("format") == FORMAT_V2:
        tables, read, failures = _target_shard_tables(store, ref, prefix, manifest, skip)
    else:
        tables, read, failures = _v1_shard_tables(store, ref, prefix, manifest, skip)
    if kept:
        tables = _with_summaries(tables, kept, manifest)
    return ShardTables(tables, read, len(skip), why, failures)


def _v1_shard_tables(store, ref: str, prefix: str, manifest: dict, skip: set[str]):
    shape = tuple(manifest["feature_shape"])
    norm = _read_normalisation(manifest)
    parts, checksums, failures, read = [], {}, [], 0
    for split in SPLITS:
        info = manifest["splits"].get(split, {"num_samples": 0, "shards": []})
        checksums_ok = True
        for entry in info["shards"]:
            if entry["path"] in skip:
                continue
            data = store.get_object(ref, prefix + entry["path"])
            read += 1
            if not _checksum(entry, hashlib.sha256(data).hexdigest(), failures):
                checksums_ok = False
                continue
            features, labels = decode_shard(data, entry["num_samples"], shape)
            parts.append(pd.DataFrame({"split": split, "label": labels.astype(np.int64),
                                       **_feature_figures(features, len(labels), norm)}))
        checksums[split] = checksums_ok
    samples = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"split": pd.Series(dtype=str), "label": pd.Series(dtype="int64"), "finite": pd.Series(dtype=bool),
         "max_abs": pd.Series(dtype="float64")})
    samples["train_label"] = samples["label"].where(samples["split"] == "train")
    return {"samples": samples, "splits": _split_table(manifest, checksums)}, read, failures


def _checksum(entry: dict, digest: str, failures: list[str]) -> bool:
    """Whether a shard read back is the one its manifest entry describes; if not, a failure naming it
    (its samples are not decoded: they are not the bytes the version holds)."""
    if digest == entry["sha256"]:
        return True
    failures.append(f"shard {entry['path']}: sha256 {digest} read back differs from its manifest entry "
                    f"{entry['sha256']}")
    return False


# ---------------------------------------------------------------- kept parts by their summaries
# Which expectations on ``samples`` a kept part's summary rows judge as its every row would:
# - a map expectation (one row at a time, ``mostly`` 1) on a column a part's rows hold whatever
#   the rest of the version is (split, label, target ...): the part's rows passed it when their
#   version was checked, by the same suite; its summary rows hold values of those rows, so pass too;
# - ``max_abs`` and ``finite`` depend on this version's normalisation: a summary row holds the
#   part's largest absolute normalised feature and whether it is finite, exact from its extremes
#   (normalising is monotone per feature), so an upper bound on ``max_abs`` is judged exactly; a
#   lower bound above 0 is not (the part's least is not known);
# - the distinct values of a discrete column (which splits, labels, classes in train) are exact:
#   a summary row stands for each (split, label) a part holds.
# Anything else (a ``mostly`` below 1, a mean, a count of rows, an expectation on two columns)
# needs the rows themselves: the kept shards are then read back, as before parts.
_FIXED_COLUMNS = {"split", "label", "train_label", "target", "target_finite", "target_binary", "finite"}
_DISTINCT = {"expect_column_distinct_values_to_equal_set", "expect_column_distinct_values_to_contain_set",
             "expect_column_distinct_values_to_be_in_set"}
_DISCRETE_COLUMNS = {"split", "label", "train_label", "finite", "target_finite", "target_binary"}


def summarisable(expectation: Any) -> bool:
    """Whether kept parts' summary rows give ``expectation`` on ``samples`` its verdict on every row."""
    kind, column = expectation.expectation_type, getattr(expectation, "column", None)
    if kind in _DISTINCT:
        return column in _DISCRETE_COLUMNS
    if placement(expectation) != "map" or column is None or getattr(expectation, "mostly", 1) not in (None, 1):
        return False
    if column == "max_abs":
        low = getattr(expectation, "min_value", None)
        return kind == "expect_column_values_to_be_between" and (
            low is None or low < 0 or (low == 0 and not getattr(expectation, "strict_min", False)))
    return column in _FIXED_COLUMNS


def _summarised_parts(manifest: dict, suite: Mapping[str, Sequence[Any]] | None) -> tuple[list[dict], str | None]:
    """(the kept parts that stand in ``samples`` by their summaries, why any kept shard is read back)."""
    carried = {e["path"] for info in manifest["splits"].values() for e in info["shards"] if e.get(CARRIED)}
    if suite is None or not carried:
        return [], None
    other = [e for e in suite.get("samples", []) if not summarisable(e)]
    if other:
        names = sorted({f"{e.expectation_type}({getattr(e, 'column', '')})" for e in other})
        return [], f"the suite's {', '.join(names[:3])} on samples need(s) every row"
    kept, old = [], 0
    for part in manifest.get("parts", []):
        paths = {p for info in part["splits"].values() for p in info["shards"]}
        if paths and paths <= carried:
            if SUMMARY in part:
                kept.append(part)
            else:
                old += 1
    return kept, (f"{old} kept part(s) were made before parts kept summaries" if old else None)


def _with_summaries(tables: dict[str, pd.DataFrame], kept: list[dict], manifest: dict) -> dict[str, pd.DataFrame]:
    """``tables`` with the kept parts' rows in ``samples`` and their positives in ``labels``."""
    norm = _read_normalisation(manifest)
    task = manifest.get("task", "classification")
    rows = []
    for part in kept:
        summary = part[SUMMARY]
        figures = _extreme_figures(summary["features"], norm, part["rows"])
        for split in SPLITS:
            if not part["splits"].get(split, {}).get("num_samples"):
                continue
            if task == "classification":
                rows += [{"split": split, "label": int(label), **f} for label in summary["labels"][split]
                         for f in figures]
            elif task == "regression":
                target = summary["target"]
                values = [v for v in (target["min"][0], target["max"][0]) if np.isfinite(v)]
                targets = [{"target": v, "target_finite": True} for v in values]
                if target["nonfinite"]:
                    targets.append({"target": np.nan, "target_finite": False})
                rows += [{"split": split, **f, **t} for f in figures for t in targets]
            else:
                binary = [False] * bool(summary["nonbinary"]) + [True] * (summary["nonbinary"] < part["rows"])
                rows += [{"split": split, **f, "target_binary": b} for f in figures for b in binary]
    samples = tables["samples"]
    extra = pd.DataFrame(rows, columns=[c for c in samples.columns if c != "train_label"])
    if "label" in extra:
        extra["label"] = extra["label"].astype(np.int64)
        extra["train_label"] = extra["label"].where(extra["split"] == "train")
    out = {**tables, "samples": pd.concat([samples, extra.astype(samples.dtypes.to_dict())], ignore_index=True)}
    if "labels" in tables:
        labels = tables["labels"].copy()
        for part in kept:
            positives = part[SUMMARY]["positives"]
            labels["train_positives"] += np.asarray(positives["train"], dtype=np.int64)
            labels["positives"] += np.sum([positives[s] for s in SPLITS], axis=0).astype(np.int64)
        out["labels"] = labels
    return out


def _extreme_figures(features: dict, norm: tuple[np.ndarray, np.ndarray] | None, rows: int) -> list[dict]:
    """``finite`` and ``max_abs`` rows that a part's samples hold under ``norm``, from its extremes:
    one for its rows with a non-finite feature, one for the others (computed as ``_feature_figures``
    computes a sample's, in float32, at the least and greatest value of each feature)."""
    out = [{"finite": False, "max_abs": np.inf}] if features["nonfinite"] else []
    if features["nonfinite"] < rows:
        ends = np.asarray([features["min"], features["max"]], dtype=np.float32)
        figures = _feature_figures(ends, 2, norm)
        finite = bool(figures["finite"].all())
        out.append({"finite": finite, "max_abs": float(figures["max_abs"].max()) if finite else np.inf})
    return out


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


def _target_shard_tables(store, ref: str, prefix: str, manifest: dict, skip: set[str]):
    """``shard_tables`` of a v2 table (regression or multi-label targets). Each shard file is copied
    from the store to a temporary file and read the way the trainer reads it
    (``training_runtime.data.shard_format.ShardColumns``); one at a time, so memory holds one shard."""
    columns = columns_from_manifest(manifest)
    norm = _read_normalisation(manifest)
    multilabel = manifest["task"] == "multilabel"
    names = list(manifest.get("target_names") or [])
    positives = {split: np.zeros(len(names), dtype=np.int64) for split in SPLITS}
    parts, checksums, failures, read = [], {}, [], 0
    with tempfile.TemporaryDirectory(prefix="shard-check-") as tmp:
        for split in SPLITS:
            info = manifest["splits"].get(split, {"num_samples": 0, "shards": []})
            checksums_ok = True
            for i, entry in enumerate(info["shards"]):
                if entry["path"] in skip:
                    continue
                path = store.download(ref, prefix + entry["path"], Path(tmp) / f"{split}-{i:05d}.bin")
                read += 1
                if not _checksum(entry, _sha256(path), failures):
                    checksums_ok = False
                    path.unlink()
                    continue
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
    empty = {"split": pd.Series(dtype=str), "finite": pd.Series(dtype=bool), "max_abs": pd.Series(dtype="float64")}
    if multilabel:
        empty["target_binary"] = pd.Series(dtype=bool)
    else:
        empty.update(target=pd.Series(dtype="float64"), target_finite=pd.Series(dtype=bool))
    samples = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(empty)
    tables = {"samples": samples, "splits": _split_table(manifest, checksums)}
    if multilabel:
        tables["labels"] = pd.DataFrame({"column": names, "train_positives": positives["train"],
                                         "positives": sum(positives.values())})
    return tables, read, failures


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
