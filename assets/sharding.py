"""Pure logic of the shards asset: a seeded split that is stable as data grows, normalisation
fitted on the training split, fixed-size binary shards and their manifest.

Shard file layout (little-endian, nothing else in the file): all features of the shard's samples
(num_samples x prod(feature_shape) float32, C order), then all labels (num_samples int64). Readers
memory-map the file and slice whole batches without decoding sample by sample.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

MANIFEST_FORMAT = "model-factory.shards/v1"
SPLITS = ("train", "validation", "test")


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

    def apply(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.std).astype(np.float32, copy=False)

    def to_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}


def sample_bytes(feature_shape: tuple[int, ...]) -> int:
    """Bytes one sample takes in a shard: float32 features and an int64 label."""
    return int(np.prod(feature_shape)) * 4 + 8


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
    """Write one split's shards under out_dir/split/ and return their manifest entries."""
    entries = []
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, len(labels), samples_per_shard)):
        stop = min(start + samples_per_shard, len(labels))
        data = encode_shard(features[start:stop], labels[start:stop])
        rel = f"{split}/{i:05d}.bin"
        (out_dir / rel).write_bytes(data)
        entries.append({
            "path": rel,
            "num_samples": stop - start,
            "sha256": hashlib.sha256(data).hexdigest(),
            "num_bytes": len(data),
        })
    return entries


def build_shards(
    frame: pd.DataFrame,
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
) -> dict:
    """Split, normalise and shard ``frame`` into ``out_dir``; return the manifest."""
    ids = frame[id_column] if id_column else pd.util.hash_pandas_object(frame[list(feature_columns) + [label_column]], index=False)
    # Sort by id so row order in the source does not change shard contents.
    order = np.argsort(ids.astype(str).to_numpy(), kind="stable")
    frame = frame.iloc[order].reset_index(drop=True)
    ids = ids.iloc[order].reset_index(drop=True)
    split_of = assign_splits(ids, seed, fractions)
    features = frame[list(feature_columns)].to_numpy(dtype=np.float32)
    label_index = {name: i for i, name in enumerate(class_names)}
    labels = frame[label_column].astype(str).map(label_index).to_numpy(dtype=np.int64)
    for code, split in enumerate(SPLITS):
        if not (split_of == code).any():
            raise ValueError(
                f"the {split} split is empty ({len(frame)} rows in all): add data or change the split fractions"
            )
    norm = Normalisation.fit(features[split_of == 0])
    features = norm.apply(features)
    splits = {}
    for code, split in enumerate(SPLITS):
        mask = split_of == code
        shards = write_split_shards(out_dir, split, features[mask], labels[mask], samples_per_shard)
        splits[split] = {"num_samples": int(mask.sum()), "shards": shards}
    return {
        "format": MANIFEST_FORMAT,
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
