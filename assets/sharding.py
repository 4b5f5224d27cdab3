"""Pure logic of the shards asset: a seeded split that is stable as data grows, normalisation
fitted on the training split, fixed-size binary shards and their manifest.

Classification tables keep shard format v1 (old model versions read them): all features of the
shard's samples (num_samples x prod(feature_shape) float32, C order), then all labels
(num_samples int64), little-endian, nothing else in the file. Readers memory-map the file and
slice whole batches without decoding sample by sample.

Regression and multi-label tables use shard format v2 (``training_runtime.data.shard_format``):
columns ``features`` (float32, feature_shape), ``target`` (float32: a scalar in the source's
units, or k 0/1 values) and ``id`` (str). Same split, same normalisation of the features.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from assets.kinds.image_parts import KEY_CHARS, cut_points
from training_runtime.data.shard_format import FORMAT_V2, NORMALISE_ON_READ, Column, ShardWriter

MANIFEST_FORMAT = "model-factory.shards/v1"
SPLITS = ("train", "validation", "test")
ID_BYTES_ESTIMATE = 24  # a typical id's UTF-8 bytes and its 8-byte offset, for sizing v2 shards in bytes
CARRIED = "carried"  # a shard entry's mark: a previous version's file, kept; dropped before the manifest is published
# A part record's figures for the shard checks of later versions that keep it: its features'
# extremes and non-finite rows, and its labels per split (regression: its targets' extremes;
# multi-label: positives per label and split, rows not 0/1).
SUMMARY = "summary"


def assign_splits(ids: pd.Series, seed: int, fractions: tuple[float, float, float]) -> np.ndarray:
    """Split index per row (0 train, 1 validation, 2 test) from a seeded hash of each row's id.

    Hashing the id rather than shuffling positions keeps every existing sample in the same split
    when new rows arrive, so test figures of two versions stay comparable.
    """
    keys = ids.astype(str).to_numpy()
    salt = f"{seed}:".encode()
    # 8 bytes of blake2b -> uniform in [0, 1)
    u = np.fromiter(
        (int.from_bytes(hashlib.blake2b(salt + k.encode(), digest_size=8).digest(), "little") / 2**64 for k in keys),
        dtype=np.float64,
        count=len(keys),
    )
    cut1, cut2 = fractions[0], fractions[0] + fractions[1]
    return np.where(u < cut1, 0, np.where(u < cut2, 1, 2)).astype(np.int8)


@dataclass(frozen=True)
class Normalisation:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, features: np.ndarray) -> "Normalisation":
        mean = features.mean(axis=0, dtype=np.float64)
        std = features.std(axis=0, dtype=np.float64)
        std[std < 1e-12] = 1.0  # constant features (e.g. always-blank pixels) pass through centred
        return cls(mean=mean.astype(np.float32), std=std.astype(np.float32))

    @classmethod
    def from_moments(cls, moments: dict, dim: int) -> "Normalisation":
        """The normalisation of the rows whose merged moments these are (``merge_moments``)."""
        mean, std = _mean_std(moments) if moments["n"] else (np.zeros(dim), np.ones(dim))
        std = std.copy()
        std[std < 1e-12] = 1.0  # constant features (e.g. always-blank pixels) pass through centred
        return cls(mean=mean.astype(np.float32), std=std.astype(np.float32))

    def apply(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.std).astype(np.float32, copy=False)

    def to_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}


def sample_bytes(feature_shape: tuple[int, ...]) -> int:
    """Bytes one sample takes in a shard: float32 features and an int64 label."""
    return int(np.prod(feature_shape)) * 4 + 8


def target_sample_bytes(feature_shape: tuple[int, ...], target_width: int) -> int:
    """Bytes one sample of a v2 table shard takes, about: float32 features, ``target_width``
    float32 targets and its id."""
    return int(np.prod(feature_shape)) * 4 + 4 * target_width + ID_BYTES_ESTIMATE


def encode_shard(features: np.ndarray, labels: np.ndarray) -> bytes:
    """One shard's bytes in the layout above."""
    f = np.ascontiguousarray(features, dtype="<f4")
    y = np.ascontiguousarray(labels, dtype="<i8")
    if f.shape[0] != y.shape[0]:
        raise ValueError(f"{f.shape[0]} feature rows but {y.shape[0]} labels")
    return f.tobytes() + y.tobytes()


def decode_shard(data: bytes | memoryview, num_samples: int, feature_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    width = int(np.prod(feature_shape))
    fbytes = num_samples * width * 4
    if len(data) != fbytes + num_samples * 8:
        raise ValueError(f"shard holds {len(data)} bytes, expected {fbytes + num_samples * 8} for {num_samples} samples")
    f = np.frombuffer(data, dtype="<f4", count=num_samples * width).reshape((num_samples, *feature_shape))
    y = np.frombuffer(data, dtype="<i8", offset=fbytes, count=num_samples)
    return f, y


def write_split_shards(
    out_dir: Path, split: str, features: np.ndarray, labels: np.ndarray, samples_per_shard: int
) -> list[dict]:
    """Write one split's shards under out_dir/split/ from in-memory arrays; return their entries."""
    rows = np.arange(len(labels))
    return [_write_shard(out_dir, f"{split}/{i:05d}.bin", features, rows[start:start + samples_per_shard],
                         labels[start:start + samples_per_shard], None, len(labels) or 1)
            for i, start in enumerate(range(0, len(labels), samples_per_shard))]


def _write_shard(out_dir: Path, rel: str, features: np.ndarray, rows: np.ndarray, labels: np.ndarray,
                 norm: "Normalisation | None", block_rows: int) -> dict:
    """One shard file (``encode_shard``'s layout) written ``block_rows`` samples at a time, so a
    64 MB shard never sits in memory whole; returns its manifest entry."""
    path = out_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for start in range(0, len(rows), block_rows):
            block = np.asarray(features[rows[start:start + block_rows]], dtype="<f4")  # a copy: gathered rows
            if norm:  # in place, the same float32 arithmetic as Normalisation.apply, without its two temporaries
                block -= norm.mean
                block /= norm.std
            data = np.ascontiguousarray(block).data
            digest.update(data)
            f.write(data)
        tail = np.ascontiguousarray(labels, dtype="<i8").data
        digest.update(tail)
        f.write(tail)
        size = f.tell()
    return {"path": rel, "num_samples": len(rows), "sha256": digest.hexdigest(), "num_bytes": size}


Chunk = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # (features float32, label texts, ids or None)


def build_shards(frame: pd.DataFrame, *, feature_columns: tuple[str, ...], label_column: str,
                 id_column: str | None, **options) -> dict:
    """``build_shards_from_chunks`` (same keyword ``options``) on an in-memory, validated ``frame``."""
    chunk = (frame[list(feature_columns)].to_numpy(dtype=np.float32), frame[label_column].astype(str).to_numpy(),
             frame[id_column].astype(str).to_numpy() if id_column else None)
    return build_shards_from_chunks([chunk], feature_columns=feature_columns, label_column=label_column,
                                    id_column=id_column, **options)


def build_shards_from_chunks(
    chunks: Iterable[Chunk],
    *,
    out_dir: Path,
    feature_columns: tuple[str, ...],
    label_column: str,
    class_names: tuple[str, ...],
    id_column: str | None,
    feature_shape: tuple[int, ...],
    seed: int,
    fractions: tuple[float, float, float],
    samples_per_shard: int,
    block_rows: int = 8192,
    salt: str = "",
    previous: dict | None = None,
    spans: list[int] | None = None,
) -> dict:
    """Split and shard validated data arriving in chunks, in parts; return the manifest.

    Memory is bounded by a chunk and ``block_rows``, not by the data: features go to a scratch
    file next to the shards as they arrive, only ids and labels (tens of bytes a row) stay in
    memory, and each split's shards are gathered from the memory-mapped scratch file in id order
    and written block by block. Rows are ordered by id, so the order of the source does not
    change the shards.

    The rows are cut into parts (``_write_parts``) and the features are stored as the source gives
    them, with the normalisation fitted on the training split (merged from each part's moments)
    applied on read (``NORMALISE_ON_READ``): a part of ``previous`` (the manifest this version
    builds on) with the same key is kept, its shards neither written nor uploaded again.

    ``spans``: the rows are some whole parts of a larger table, these many rows each in id order
    (assets/table_shard_steps.py shards a table's parts over steps): they are cut there rather
    than where ``cut_points`` would cut these rows alone, and an empty split is not refused (it is
    the whole table's split that must not be empty).
    """
    dim = int(np.prod(feature_shape))
    label_index = {name: i for i, name in enumerate(class_names)}
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = out_dir / ".features.scratch"
    try:
        ids_parts, label_parts, n = [], [], 0
        with open(scratch, "wb") as f:
            for features, texts, ids in chunks:
                features = np.ascontiguousarray(features, dtype=np.float32).reshape(len(texts), dim)
                f.write(features.data)
                ids_parts.append(chunk_ids("classification", features, texts, ids, id_column=id_column,
                                           feature_columns=feature_columns, target_names=(label_column,)))
                label_parts.append(pd.Series(texts).astype(str).map(label_index).to_numpy(dtype=np.int64))
                n += len(texts)
        ids = np.concatenate(ids_parts) if ids_parts else np.array([], dtype=str)
        labels = np.concatenate(label_parts) if label_parts else np.array([], dtype=np.int64)
        del ids_parts, label_parts
        order, split_of = _split_rows(ids, seed, fractions, whole=spans is None)
        features = np.memmap(scratch, dtype=np.float32, mode="r", shape=(n, dim))

        def write(rel: str, rows: np.ndarray) -> dict:
            return _write_shard(out_dir, rel, features, rows, labels[rows], None, block_rows)

        def summary(rows: np.ndarray, codes: np.ndarray) -> dict:
            return {"features": _extremes(features, rows),
                    "labels": {split: _counts(labels[rows[codes == c]]) for c, split in enumerate(SPLITS)}}

        parts = _write_parts(ids, order, split_of, target=samples_per_shard, salt=salt, previous=previous,
                             content=lambda rows: _row_bytes(rows, block_rows, features, labels), write=write,
                             samples_per_shard=samples_per_shard, spans=spans,
                             stats=lambda rows: {"features": _moments(features, rows)}, summary=summary)
        del features
    finally:
        scratch.unlink(missing_ok=True)
    return table_manifest(v1_header(feature_columns=feature_columns, class_names=class_names, id_column=id_column,
                                    feature_shape=feature_shape, seed=seed, fractions=fractions,
                                    samples_per_shard=samples_per_shard), parts)


def v1_header(*, feature_columns: tuple[str, ...], class_names: tuple[str, ...], id_column: str | None,
              feature_shape: tuple[int, ...], seed: int, fractions: tuple[float, float, float],
              samples_per_shard: int) -> dict:
    """What a format v1 manifest says besides its parts and what they make (``table_manifest``):
    a function of the pipeline alone, so a version sharded over steps has the same one."""
    return {
        "format": MANIFEST_FORMAT,
        "feature_columns": list(feature_columns),
        "feature_shape": list(feature_shape),
        "feature_dtype": "float32",
        "label_dtype": "int64",
        "num_classes": len(class_names),
        "class_names": list(class_names),
        "samples_per_shard": samples_per_shard,
        NORMALISE_ON_READ: True,
        "split": {"seed": seed, "fractions": dict(zip(SPLITS, fractions)), "by": id_column or "row content hash"},
    }


def table_manifest(header: dict, parts: list["TablePart"]) -> dict:
    """A table's manifest from its ``header`` (``v1_header`` / ``v2_header``) and its ``parts`` in
    id order: their shards per split, their records, the normalisation of the features merged from
    their moments and, for regression, that of the targets. The one place both the single-step
    build and the steps' ``publish`` (assets/table_shard_steps.py) make it, so they cannot differ."""
    dim = int(np.prod(header["feature_shape"]))
    norm = Normalisation.from_moments(merge_moments([p.record["stats"]["features"] for p in parts]), dim)
    manifest = {**header, "normalisation": norm.to_dict(), "splits": _splits_of(parts),
                "parts": [p.record for p in parts]}
    if header.get("task") == "regression":
        manifest["target_normalisation"] = _target_normalisation(
            merge_moments([p.record["stats"]["target"] for p in parts]))
    return manifest


# ---------------------------------------------------------------- a table in parts
# A table's rows, in id order, are cut into parts as an image folder's files are
# (assets/kinds/image_parts.py: content-defined cuts over the sorted ids, about ``samples_per_shard``
# rows a part), and each part writes its own shards per split (``<split>/<part name>-<n>.bin``).
# A part's key is the sha256 of the run's salt (the data key's parameters and code) and its rows'
# ids and bytes, so rows appended anywhere, or changed or removed, make new parts only where they
# fall: the other parts' shards are the previous version's files, kept. The shards hold the
# features as the source gives them; the normalisation comes from the parts' moments (count, mean
# and sum of squared deviations of the training rows, merged as Chan et al.'s parallel variance)
# and is applied on read (training_runtime/data/shard_format.py NORMALISE_ON_READ).


@dataclass(frozen=True)
class TablePart:
    record: dict  # what the manifest keeps of it: key, name, first and last id, its shards and moments
    entries: dict[str, list[dict]]  # split -> its shards' manifest entries


def moments(x: np.ndarray) -> dict:
    """Count, mean and sum of squared deviations per column of ``x`` (rows x columns), float64."""
    x = np.asarray(x, dtype=np.float64)
    x = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))
    if not len(x):
        return {"n": 0, "mean": [0.0] * x.shape[1], "m2": [0.0] * x.shape[1]}
    # a non-finite source value gives non-finite figures, which the shard checks report
    with np.errstate(invalid="ignore", over="ignore"):
        mean = x.mean(axis=0)
        return {"n": int(len(x)), "mean": mean.tolist(), "m2": ((x - mean) ** 2).sum(axis=0).tolist()}


def merge_moments(parts: list[dict]) -> dict:
    """The moments of the union of the rows of ``parts`` (Chan, Golub and LeVeque's pairwise update)."""
    n, mean, m2 = 0, None, None
    for p in parts:
        if not p["n"]:
            continue
        pm, pm2 = np.asarray(p["mean"], dtype=np.float64), np.asarray(p["m2"], dtype=np.float64)
        if mean is None:
            n, mean, m2 = p["n"], pm, pm2
            continue
        total = n + p["n"]
        with np.errstate(invalid="ignore", over="ignore"):
            delta = pm - mean
            mean = mean + delta * (p["n"] / total)
            m2 = m2 + pm2 + delta * delta * (n * p["n"] / total)
        n = total
    if mean is None:
        width = len(parts[0]["mean"]) if parts else 0
        return {"n": 0, "mean": [0.0] * width, "m2": [0.0] * width}
    return {"n": int(n), "mean": mean.tolist(), "m2": m2.tolist()}


def _mean_std(m: dict) -> tuple[np.ndarray, np.ndarray]:
    n = max(1, m["n"])
    return np.asarray(m["mean"], dtype=np.float64), np.sqrt(np.maximum(np.asarray(m["m2"], dtype=np.float64), 0) / n)


MOMENT_ROWS = 4096  # rows a part's moments are taken over at a time, then merged


def _moments(values: np.ndarray, rows: np.ndarray) -> dict:
    """``moments(values[rows])``, gathered ``MOMENT_ROWS`` at a time and merged: a fixed block, not
    the reader's chunk size, so the figures depend on the rows alone (the same bits however the
    source was read)."""
    return merge_moments([moments(values[rows[s:s + MOMENT_ROWS]]) for s in range(0, len(rows), MOMENT_ROWS)]
                         or [moments(values[rows[:0]])])


def _extremes(values: np.ndarray, rows: np.ndarray) -> dict:
    """Over ``values[rows]`` (rows x columns): the rows holding a non-finite value, and per column
    the least and greatest value of the other rows (float32, as the shards hold them; +inf and
    -inf when none). Normalising is monotone per column, so a later normalisation's largest
    absolute value over these rows is at one of the two: the shard checks of a version that keeps
    this part compute it from them (assets/quality/tables.py)."""
    width = int(np.prod(values.shape[1:]))
    low, high, nonfinite = np.full(width, np.inf, np.float32), np.full(width, -np.inf, np.float32), 0
    for s in range(0, len(rows), MOMENT_ROWS):
        block = np.asarray(values[rows[s:s + MOMENT_ROWS]], dtype=np.float32).reshape(-1, width)
        finite = np.isfinite(block).all(axis=1)
        nonfinite += int((~finite).sum())
        if finite.any():
            low = np.minimum(low, block[finite].min(axis=0))
            high = np.maximum(high, block[finite].max(axis=0))
    return {"min": low.tolist(), "max": high.tolist(), "nonfinite": nonfinite}


def _counts(labels: np.ndarray) -> dict[str, int]:
    """Rows per label code, the codes as text (JSON keys)."""
    values, counts = np.unique(labels, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def _row_bytes(rows: np.ndarray, block_rows: int, *columns: np.ndarray):
    """The bytes of ``rows`` of each column, ``block_rows`` at a time (what a part's key hashes)."""
    for column in columns:
        for s in range(0, len(rows), block_rows):
            yield np.ascontiguousarray(column[rows[s:s + block_rows]]).data


def _write_parts(ids: np.ndarray, order: np.ndarray, split_of: np.ndarray, *, target: int, salt: str,
                 previous: dict | None, content, write, samples_per_shard: int, stats, summary,
                 spans: list[int] | None = None) -> list[TablePart]:
    """Cut the rows (``order``: positions in id order; ``split_of``: each one's split code) into
    parts, keep those of ``previous`` with the same key and write the others' shards with
    ``write(rel, rows)``; ``content(rows)`` gives the bytes a part's key hashes, ``stats(rows)``
    the moments of its training rows and ``summary(rows, codes)`` what the shard checks of a later
    version need of it without reading its shards back (``SUMMARY``). ``spans``: the parts' sizes,
    given (the rows are whole parts of a larger table), rather than cut here."""
    kept = previous_parts(previous)
    sorted_ids = ids[order]
    parts, start = [], 0
    for stop in (_stops(spans, len(order)) if spans is not None else cut_points(sorted_ids, target) if len(order)
                 else []):  # ids one at a time: no list of them all
        rows, codes = order[start:stop], split_of[start:stop]
        members = hashlib.sha256("\0".join(sorted_ids[start:stop].tolist()).encode())
        for data in content(rows):
            members.update(data)
        digest = members.hexdigest()
        key = hashlib.sha256(f"{salt}\0{digest}".encode()).hexdigest()
        name = digest[:KEY_CHARS]
        if key in kept:
            parts.append(kept[key])
        else:
            entries = {}
            for code, split in enumerate(SPLITS):
                mine = rows[codes == code]
                entries[split] = [write(f"{split}/{name}-{i:05d}.bin", mine[s:s + samples_per_shard])
                                  for i, s in enumerate(range(0, len(mine), samples_per_shard))]
            record = {"key": key, "name": name, "first_id": str(sorted_ids[start]),
                      "last_id": str(sorted_ids[stop - 1]), "rows": int(stop - start),
                      "splits": {s: {"num_samples": sum(e["num_samples"] for e in es),
                                     "shards": [e["path"] for e in es]} for s, es in entries.items()},
                      "stats": stats(rows[codes == 0]), SUMMARY: summary(rows, codes)}
            parts.append(TablePart(record, entries))
        start = stop
    return parts


def _stops(spans: list[int], rows: int) -> list[int]:
    """The stops of parts of ``spans`` rows each, which must add up to ``rows``."""
    stops = np.cumsum(np.asarray(spans, dtype=np.int64)).tolist()
    if (stops[-1] if stops else 0) != rows or any(n < 1 for n in spans):
        raise RuntimeError(f"parts of {spans[:5]}... rows ({sum(spans)} in all) do not cut {rows} row(s): the rows "
                           "read are not the planned parts'; re-execute the whole run")
    return stops


def previous_parts(previous: dict | None) -> dict[str, TablePart]:
    """The parts of the manifest a version builds on, by key, each shard entry marked ``CARRIED``
    (a manifest written before parts, or with its features normalised in the shards, has none)."""
    if not previous or not previous.get(NORMALISE_ON_READ):
        return {}
    by_path = {e["path"]: e for info in previous["splits"].values() for e in info["shards"]}
    return {r["key"]: TablePart(r, {s: [{**by_path[p], CARRIED: True} for p in info["shards"]]
                                    for s, info in r["splits"].items()})
            for r in previous.get("parts", [])}


def _splits_of(parts: list[TablePart]) -> dict:
    """The manifest's splits: every part's shards, parts in id order."""
    return {s: {"num_samples": sum(p.record["splits"][s]["num_samples"] for p in parts),
                "shards": [e for p in parts for e in p.entries[s]]} for s in SPLITS}


def _split_rows(ids: np.ndarray, seed: int, fractions: tuple[float, float, float], *,
                whole: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(row positions sorted by id, split code of each of them); refuses an empty split of the
    ``whole`` table (``refuse_empty_split``)."""
    order = np.argsort(ids, kind="stable")
    split_of = assign_splits(pd.Series(ids[order]), seed, fractions)
    if whole:
        refuse_empty_split(split_of, len(ids))
    return order, split_of


def refuse_empty_split(split_of: np.ndarray, rows: int) -> None:
    """A ValueError naming the first split that no row falls in."""
    for code, split in enumerate(SPLITS):
        if not (split_of == code).any():
            raise ValueError(f"the {split} split is empty ({rows} rows in all): add data or change the split "
                             "fractions")


def chunk_ids(task: str, features: np.ndarray, targets: np.ndarray, ids: np.ndarray | None, *,
              id_column: str | None, feature_columns, target_names) -> np.ndarray:
    """The ids a chunk's rows are split and ordered by: the id column's, or else a hash of each
    row's content (``features`` as float32 rows, ``targets`` as the raw copy gives them). The
    planning of a table's parts over steps (assets/table_shard_steps.py) computes them here too."""
    if id_column:
        return ids.astype(str)
    rows = len(features)
    features = np.ascontiguousarray(features, dtype=np.float32).reshape(rows, -1)
    if task == "classification":
        return _content_ids(features, targets, feature_columns, target_names[0])
    width = 1 if task == "regression" else len(target_names)
    return _target_content_ids(features, np.asarray(targets).reshape(rows, width), feature_columns, target_names)


def _content_ids(features: np.ndarray, texts: np.ndarray, feature_columns, label_column: str) -> np.ndarray:
    """A row's id when the source has none: a hash of its features and label."""
    frame = pd.DataFrame(features, columns=list(feature_columns))
    frame[label_column] = pd.Series(texts, dtype=str).to_numpy()
    return pd.util.hash_pandas_object(frame, index=False).astype(str).to_numpy()


TARGET_TASKS = ("regression", "multilabel")


def target_columns(task: str, feature_shape: tuple[int, ...], num_targets: int) -> list[Column]:
    """The v2 columns of a regression (one target) or multi-label (``num_targets`` 0/1) table."""
    if task not in TARGET_TASKS:
        raise ValueError(f"task {task!r} has no v2 table shards; use one of {TARGET_TASKS}")
    shape = () if task == "regression" else (num_targets,)
    return [Column("features", "ndarray", role="input", dtype="float32", shape=tuple(feature_shape)),
            Column("target", "ndarray", role="target", dtype="float32", shape=shape),
            Column("id", "str", role="id")]


def build_target_shards_from_chunks(
    chunks: Iterable[Chunk],
    *,
    out_dir: Path,
    task: str,
    feature_columns: tuple[str, ...],
    target_names: tuple[str, ...],
    id_column: str | None,
    feature_shape: tuple[int, ...],
    seed: int,
    fractions: tuple[float, float, float],
    samples_per_shard: int,
    block_rows: int = 8192,
    target_range: tuple[float, float] | None = None,
    salt: str = "",
    previous: dict | None = None,
    spans: list[int] | None = None,
) -> dict:
    """``build_shards_from_chunks`` for regression and multi-label tables, in shard format v2.

    ``chunks`` hold (features, targets, ids or None): targets are one number per row (regression;
    ``target_names`` is the label column) or rows of 0/1 (multilabel; ``target_names`` are the
    label columns). Features and targets go to scratch files as they arrive and only ids stay in
    memory; the split, the order by id, the parts and the normalisation of the features (fitted on
    the training split, applied on read) are those of v1. A shard is assembled in memory before it
    is written, so memory holds one shard (``samples_per_shard`` samples) at a time. Regression
    targets are stored in the source's units; the manifest's ``target_normalisation`` is the
    training split's mean and standard deviation of them, for the trainer to apply.
    """
    columns = target_columns(task, feature_shape, len(target_names))
    dim = int(np.prod(feature_shape))
    width = 1 if task == "regression" else len(target_names)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch, target_scratch = out_dir / ".features.scratch", out_dir / ".targets.scratch"
    try:
        ids_parts, n = [], 0
        with open(scratch, "wb") as f, open(target_scratch, "wb") as t:
            for features, targets, ids in chunks:
                rows = len(features)
                features = np.ascontiguousarray(features, dtype=np.float32).reshape(rows, dim)
                targets = np.asarray(targets).reshape(rows, width)
                f.write(features.data)
                t.write(np.ascontiguousarray(targets, dtype=np.float32).data)
                ids_parts.append(chunk_ids(task, features, targets, ids, id_column=id_column,
                                           feature_columns=feature_columns, target_names=target_names))
                n += rows
        ids = np.concatenate(ids_parts) if ids_parts else np.array([], dtype=str)
        del ids_parts
        order, split_of = _split_rows(ids, seed, fractions, whole=spans is None)
        features = np.memmap(scratch, dtype=np.float32, mode="r", shape=(n, dim))
        targets = np.memmap(target_scratch, dtype=np.float32, mode="r", shape=(n, width))
        writer = ShardWriter(columns)

        def write(rel: str, rows: np.ndarray) -> dict:  # one shard in memory at a time
            y = targets[rows]
            return writer.write(out_dir / rel, rel, {"features": features[rows].reshape(len(rows), *feature_shape),
                                                     "target": y[:, 0] if task == "regression" else y,
                                                     "id": ids[rows].tolist()})

        def stats(rows: np.ndarray) -> dict:
            out = {"features": _moments(features, rows)}
            if task == "regression":
                out["target"] = _moments(targets, rows)
            return out

        def summary(rows: np.ndarray, codes: np.ndarray) -> dict:
            out = {"features": _extremes(features, rows)}
            if task == "regression":
                out["target"] = _extremes(targets, rows)
            else:
                out["positives"] = {split: (targets[rows[codes == c]] == 1).sum(axis=0).astype(int).tolist()
                                    for c, split in enumerate(SPLITS)}
                out["nonbinary"] = int((~((targets[rows] == 0) | (targets[rows] == 1)).all(axis=1)).sum())
            return out

        parts = _write_parts(ids, order, split_of, target=samples_per_shard, salt=salt, previous=previous,
                             content=lambda rows: _row_bytes(rows, block_rows, features, targets), write=write,
                             samples_per_shard=samples_per_shard, stats=stats, summary=summary, spans=spans)
        del features, targets
    finally:
        scratch.unlink(missing_ok=True)
        target_scratch.unlink(missing_ok=True)
    return table_manifest(v2_header(task=task, feature_columns=feature_columns, target_names=target_names,
                                    id_column=id_column, feature_shape=feature_shape, seed=seed, fractions=fractions,
                                    samples_per_shard=samples_per_shard, target_range=target_range), parts)


def v2_header(*, task: str, feature_columns: tuple[str, ...], target_names: tuple[str, ...], id_column: str | None,
              feature_shape: tuple[int, ...], seed: int, fractions: tuple[float, float, float],
              samples_per_shard: int, target_range: tuple[float, float] | None = None) -> dict:
    """``v1_header`` of a regression or multi-label table (format v2)."""
    header = {
        "format": FORMAT_V2,
        "kind": "table",
        "task": task,
        "columns": [c.to_dict() for c in target_columns(task, feature_shape, len(target_names))],
        "feature_columns": list(feature_columns),
        "feature_shape": list(feature_shape),
        "samples_per_shard": samples_per_shard,
        NORMALISE_ON_READ: True,
        "split": {"seed": seed, "fractions": dict(zip(SPLITS, fractions)), "by": id_column or "row content hash"},
    }
    if task == "regression":
        header["target_column"] = target_names[0]
        if target_range is not None:
            header["target_range"] = [float(target_range[0]), float(target_range[1])]
    else:
        header["target_names"] = list(target_names)
        header["num_classes"] = len(target_names)
    return header


def _target_normalisation(moments: dict) -> dict:
    """Mean and standard deviation of the training split's regression targets (float64 over the
    float32 values the shards hold, merged from the parts' moments); a constant target keeps std 1
    so the trainer only centres it."""
    mean, std = _mean_std(moments)
    return {"mean": float(mean[0]), "std": float(std[0]) if std[0] >= 1e-12 else 1.0}


def _target_content_ids(features: np.ndarray, targets: np.ndarray, feature_columns, target_names) -> np.ndarray:
    """A row's id when the source has none: a hash of its features and targets."""
    frame = pd.DataFrame(features, columns=list(feature_columns))
    for i, name in enumerate(target_names):
        frame[name] = targets[:, i]
    return pd.util.hash_pandas_object(frame, index=False).astype(str).to_numpy()
