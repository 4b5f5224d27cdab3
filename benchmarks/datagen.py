"""Synthetic data for the benchmarks, made by the platform's own writers: loader datasets are
sharded by ``assets.sharding.build_shards``; CSV sources look like what a user brings (an id
column, float features, a label that a linear model can learn)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from assets.sharding import build_shards, sample_bytes, write_split_shards
from core.spec import Split

NUM_CLASSES = 10


def _frame(rows: int, dim: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    w = rng.standard_normal((dim, NUM_CLASSES), dtype=np.float32)
    labels = (x @ w).argmax(axis=1)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(dim)], copy=False)
    frame.insert(0, "sample_id", [f"s{i:09d}" for i in range(rows)])
    frame["label"] = labels
    return frame


def platform_shard_samples(dim: int) -> int:
    """Samples per shard the platform writes by default for ``dim`` float32 features."""
    return Split().shard_samples(sample_bytes((dim,)))


def shard_dataset(out: Path, *, rows: int, dim: int, samples_per_shard: int, seed: int = 0) -> dict:
    """A dataset directory ``out/shards`` written by ``build_shards`` (98 % of rows in train)."""
    manifest_path = out / "shards" / "manifest.json"
    if manifest_path.exists():
        cached = json.loads(manifest_path.read_text())
        if cached["samples_per_shard"] == samples_per_shard:
            return cached
    tmp = out / "shards.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    frame = _frame(rows, dim, seed)
    manifest = build_shards(
        frame, out_dir=tmp, feature_columns=tuple(f"f{i}" for i in range(dim)), label_column="label",
        class_names=tuple(str(c) for c in range(NUM_CLASSES)), id_column="sample_id", feature_shape=(dim,),
        seed=seed, fractions=(0.98, 0.01, 0.01), samples_per_shard=samples_per_shard)
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(out / "shards", ignore_errors=True)
    tmp.rename(out / "shards")
    return manifest


def train_only_shards(out: Path, *, samples: int, dim: int, samples_per_shard: int, seed: int = 0) -> dict:
    """Train-only shards written chunk by chunk with the platform's shard writer (for sizes where
    building a DataFrame first would dominate); the manifest has the shape the runtime expects."""
    manifest_path = out / "shards" / "manifest.json"
    if manifest_path.exists():
        cached = json.loads(manifest_path.read_text())
        if cached["samples_per_shard"] == samples_per_shard:
            return cached
    tmp = out / "shards.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(seed)
    entries = []
    for start in range(0, samples, samples_per_shard):
        n = min(samples_per_shard, samples - start)
        x = rng.standard_normal((n, dim), dtype=np.float32)
        y = rng.integers(0, NUM_CLASSES, n)
        part = write_split_shards(tmp / "part", "train", x, y, samples_per_shard)
        src = tmp / "part" / part[0]["path"]
        rel = f"train/{len(entries):05d}.bin"
        (tmp / "train").mkdir(parents=True, exist_ok=True)
        src.rename(tmp / rel)
        entries.append({**part[0], "path": rel})
    shutil.rmtree(tmp / "part", ignore_errors=True)
    manifest = {"format": "model-factory.shards/v1", "feature_shape": [dim], "feature_dtype": "float32",
                "label_dtype": "int64", "num_classes": NUM_CLASSES,
                "class_names": [str(c) for c in range(NUM_CLASSES)], "samples_per_shard": samples_per_shard,
                "splits": {"train": {"num_samples": samples, "shards": entries}}}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(out / "shards", ignore_errors=True)
    tmp.rename(out / "shards")
    return manifest


def csv_source(path: Path, *, rows: int, dim: int, seed: int = 0) -> Path:
    """A CSV source of ``rows`` rows: sample_id, f0..f{dim-1}, label."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    chunk = 8192
    with open(tmp, "w") as f:
        for i, start in enumerate(range(0, rows, chunk)):
            part = _frame(min(chunk, rows - start), dim, seed + i)
            part["sample_id"] = [f"s{start + j:09d}" for j in range(len(part))]
            part.to_csv(f, index=False, header=i == 0, float_format="%.6g")
    tmp.rename(path)
    return path


def locations(data: Path, manifest: dict) -> dict[str, str]:
    return {s["path"]: (data / "shards" / s["path"]).resolve().as_uri()
            for split in manifest["splits"].values() for s in split["shards"]}
