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

from training_runtime.data.shard_format import FORMAT_V2, Column, ShardWriter

MANIFEST_FORMAT = "model-factory.shards/v1"
SPLITS = ("train", "validation", "test")
ID_BYTES_ESTIMATE = 24  # a typical id's UTF-8 bytes and its 8-byte offset, for sizing v2 shards in bytes


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
    def fit_rows(cls, features: np.ndarray, rows: np.ndarray, block_rows: int) -> "Normalisation":
        """``fit(features[rows])`` without materialising ``features[rows]``: numpy's float64 mean
        and std over axis 0 add rows one after another, which this repeats block by block (the
        running total is added into each block's first row), so the result is bit-identical."""
        dim = features.shape[1]
        total = np.zeros(dim, dtype=np.float64)
        for s in range(0, len(rows), block_rows):
            block = features[rows[s:s + block_rows]].astype(np.float64)
            block[0] = total + block[0]
            total = block.sum(axis=0)
        mean = total / len(rows)
        sq = np.zeros(dim, dtype=np.float64)
        for s in range(0, len(rows), block_rows):
            d = np.subtract(features[rows[s:s + block_rows]], mean, dtype=np.float64)  # one pass: cast and centre
            d *= d
            d[0] = sq + d[0]
            sq = d.sum(axis=0)
        std = np.sqrt(sq / len(rows))
        std[std < 1e-12] = 1.0
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
) -> dict:
    """Split, normalise and shard validated data arriving in chunks; return the manifest.

    Memory is bounded by a chunk and ``block_rows``, not by the data: features go to a scratch
    file next to the shards as they arrive, only ids and labels (tens of bytes a row) stay in
    memory, and each split's shards are gathered from the memory-mapped scratch file in id order
    and written block by block. Rows are ordered by id, so the order of the source does not
    change the shards.
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
                ids_parts.append(ids.astype(str) if id_column else _content_ids(features, texts, feature_columns,
                                                                                label_column))
                label_parts.append(pd.Series(texts).astype(str).map(label_index).to_numpy(dtype=np.int64))
                n += len(texts)
        ids = np.concatenate(ids_parts) if ids_parts else np.array([], dtype=str)
        labels = np.concatenate(label_parts) if label_parts else np.array([], dtype=np.int64)
        del ids_parts, label_parts
        order, split_of = _split_rows(ids, seed, fractions)
        del ids
        features = np.memmap(scratch, dtype=np.float32, mode="r", shape=(n, dim))
        norm = Normalisation.fit_rows(features, order[split_of == 0], block_rows)
        splits = {}
        for code, split in enumerate(SPLITS):
            rows = order[split_of == code]
            shards = [_write_shard(out_dir, f"{split}/{i:05d}.bin", features, rows[start:start + samples_per_shard],
                                   labels[rows[start:start + samples_per_shard]], norm, block_rows)
                      for i, start in enumerate(range(0, len(rows), samples_per_shard))]
            splits[split] = {"num_samples": int(len(rows)), "shards": shards}
        del features
    finally:
        scratch.unlink(missing_ok=True)
    return {
        "format": MANIFEST_FORMAT,
        "feature_columns": list(feature_columns),
        "feature_shape": list(feature_shape),
        "feature_dtype": "float32",
        "label_dtype": "int64",
        "num_classes": len(class_names),
        "class_names": list(class_names),
        "samples_per_shard": samples_per_shard,
        "normalisation": norm.to_dict(),
        "split": {"seed": seed, "fractions": dict(zip(SPLITS, fractions)), "by": id_column or "row content hash"},
        "splits": splits,
    }


def _split_rows(ids: np.ndarray, seed: int, fractions: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(row positions sorted by id, split code of each of them); refuses an empty split."""
    order = np.argsort(ids, kind="stable")
    split_of = assign_splits(pd.Series(ids[order]), seed, fractions)
    for code, split in enumerate(SPLITS):
        if not (split_of == code).any():
            raise ValueError(f"the {split} split is empty ({len(ids)} rows in all): add data or change the split "
                             "fractions")
    return order, split_of


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
) -> dict:
    """``build_shards_from_chunks`` for regression and multi-label tables, in shard format v2.

    ``chunks`` hold (features, targets, ids or None): targets are one number per row (regression;
    ``target_names`` is the label column) or rows of 0/1 (multilabel; ``target_names`` are the
    label columns). Features and targets go to scratch files as they arrive and only ids stay in
    memory; the split, the order by id and the normalisation of the features (fitted on the
    training split) are those of v1. A shard is assembled in memory before it is written, so
    memory holds one shard (``samples_per_shard`` samples) at a time. Regression targets are
    stored in the source's units; the manifest's ``target_normalisation`` is the training
    split's mean and standard deviation of them, for the trainer to apply.
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
                ids_parts.append(ids.astype(str) if id_column else _target_content_ids(
                    features, targets, feature_columns, target_names))
                n += rows
        ids = np.concatenate(ids_parts) if ids_parts else np.array([], dtype=str)
        del ids_parts
        order, split_of = _split_rows(ids, seed, fractions)
        features = np.memmap(scratch, dtype=np.float32, mode="r", shape=(n, dim))
        targets = np.memmap(target_scratch, dtype=np.float32, mode="r", shape=(n, width))
        train_rows = order[split_of == 0]
        norm = Normalisation.fit_rows(features, train_rows, block_rows)
        writer = ShardWriter(columns)
        splits = {}
        for code, split in enumerate(SPLITS):
            rows = order[split_of == code]
            shards = []
            for i, start in enumerate(range(0, len(rows), samples_per_shard)):
                part = rows[start:start + samples_per_shard]
                x = features[part]  # a copy, normalised in place (the same float32 arithmetic as apply)
                x -= norm.mean
                x /= norm.std
                y = targets[part]
                rel = f"{split}/{i:05d}.bin"
                shards.append(writer.write(out_dir / rel, rel, {
                    "features": x.reshape(len(part), *feature_shape),
                    "target": y[:, 0] if task == "regression" else y,
                    "id": ids[part].tolist()}))
            splits[split] = {"num_samples": int(len(rows)), "shards": shards}
        manifest = {
            "format": FORMAT_V2,
            "kind": "table",
            "task": task,
            "columns": [c.to_dict() for c in columns],
            "feature_columns": list(feature_columns),
            "feature_shape": list(feature_shape),
            "samples_per_shard": samples_per_shard,
            "normalisation": norm.to_dict(),
            "split": {"seed": seed, "fractions": dict(zip(SPLITS, fractions)),
                      "by": id_column or "row content hash"},
            "splits": splits,
        }
        if task == "regression":
            manifest["target_column"] = target_names[0]
            manifest["target_normalisation"] = _target_normalisation(targets[train_rows, 0])
            if target_range is not None:
                manifest["target_range"] = [float(target_range[0]), float(target_range[1])]
        else:
            manifest["target_names"] = list(target_names)
            manifest["num_classes"] = len(target_names)
        del features, targets
    finally:
        scratch.unlink(missing_ok=True)
        target_scratch.unlink(missing_ok=True)
    return manifest


def _target_normalisation(train_targets: np.ndarray) -> dict:
    """Mean and standard deviation of the training split's regression targets (float64 over the
    float32 values the shards hold); a constant target keeps std 1 so the trainer only centres it."""
    y = np.asarray(train_targets, dtype=np.float64)
    std = float(y.std())
    return {"mean": float(y.mean()), "std": std if std >= 1e-12 else 1.0}


def _target_content_ids(features: np.ndarray, targets: np.ndarray, feature_columns, target_names) -> np.ndarray:
    """A row's id when the source has none: a hash of its features and targets."""
    frame = pd.DataFrame(features, columns=list(feature_columns))
    for i, name in enumerate(target_names):
        frame[name] = targets[:, i]
    return pd.util.hash_pandas_object(frame, index=False).astype(str).to_numpy()
