"""Small learnable v2 (typed-column) datasets for training tests: images, token windows and
regression rows, written with the runtime's own shard writer as the assets write them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import simplejpeg

from training_runtime.data.shard_format import FORMAT_V2, Column, ShardWriter

SPLITS = ("train", "validation", "test")


def write_splits(root: Path, columns: list[Column], splits: dict[str, dict], per_shard: int, **manifest) -> tuple[dict, dict]:
    """Shards of each split (column -> all values); returns (manifest, locations)."""
    writer, out, locations = ShardWriter(columns), {}, {}
    for split, samples in splits.items():
        n = len(next(iter(samples.values())))
        entries = []
        for i, start in enumerate(range(0, n, per_shard)):
            rel = f"shards/{split}/{i:05d}.bin"
            part = {k: v[start:start + per_shard] for k, v in samples.items()}
            entries.append(writer.write(root / rel, rel, part))
            locations[rel] = (root / rel).as_uri()
        out[split] = {"num_samples": n, "shards": entries}
    return {"format": FORMAT_V2, "columns": [c.to_dict() for c in columns], "splits": out, **manifest}, locations


def make_images(root: Path, *, sizes=(96, 32, 32), side: int = 16, encoded: bool = False, seed: int = 0):
    """Two classes: a red or a blue square at a random place on a dark noisy RGB image."""
    rng = np.random.default_rng(seed)
    column = Column("jpeg", "bytes", "input") if encoded else Column("image", "ndarray", "input", "uint8", (side, side, 3))
    columns = [column, Column("label", "ndarray", "target", "int64"), Column("id", "str", "id")]
    splits = {}
    for split, n in zip(SPLITS, sizes):
        labels = rng.integers(0, 2, n)
        images = rng.integers(0, 60, (n, side, side, 3), dtype=np.uint8)
        for i, label in enumerate(labels):
            top, left = rng.integers(0, side - side // 3, 2)
            images[i, top:top + side // 3, left:left + side // 3, 2 if label else 0] = 230
        values = [simplejpeg.encode_jpeg(im, quality=95) for im in images] if encoded else images
        splits[split] = {column.name: values, "label": labels.astype(np.int64),
                         "id": [f"{split}-{i}" for i in range(n)]}
    extra = {"sample_shape": [side, side, 3]} if encoded else {}
    return write_splits(root, columns, splits, per_shard=40, kind="images", task="classification",
                        num_classes=2, class_names=["red", "blue"], **extra)


def make_tokens(root: Path, *, sizes=(96, 24, 24), seq_len: int = 16, vocab: int = 12, seed: int = 0):
    """Language-modelling windows of seq_len + 1 tokens from a noisy counting sequence: each token
    is the previous plus one (mod vocab) nine times out of ten, so the next token is learnable."""
    rng = np.random.default_rng(seed)
    columns = [Column("tokens", "ndarray", "input", "uint16", (seq_len + 1,)), Column("id", "str", "id")]
    splits = {}
    for split, n in zip(SPLITS, sizes):
        start = rng.integers(0, vocab, n)
        steps = np.where(rng.random((n, seq_len)) < 0.9, 1, rng.integers(0, vocab, (n, seq_len)))
        tokens = (start[:, None] + np.concatenate([np.zeros((n, 1), int), np.cumsum(steps, axis=1)], axis=1)) % vocab
        splits[split] = {"tokens": tokens.astype(np.uint16), "id": [f"{split}-{i}" for i in range(n)]}
    return write_splits(root, columns, splits, per_shard=40, kind="text", task="language_modeling",
                        tokenizer={"kind": "byte-test", "vocab_size": vocab, "eos_id": None, "pad_id": None})


def make_text_classes(root: Path, *, sizes=(96, 32, 32), seq_len: int = 12, vocab: int = 20, seed: int = 0):
    """Padded token documents of two classes: class 1's documents contain token 3, class 0's never
    do (pad id 1, document lengths 4..seq_len), as text classification shards store them."""
    rng = np.random.default_rng(seed)
    columns = [Column("tokens", "ndarray", "input", "uint16", (seq_len,)),
               Column("length", "ndarray", "input", "int32", ()),
               Column("label", "ndarray", "target", "int64", ()), Column("id", "str", "id")]
    splits = {}
    for split, n in zip(SPLITS, sizes):
        labels = rng.integers(0, 2, n)
        lengths = rng.integers(4, seq_len + 1, n)
        tokens = np.full((n, seq_len), 1, dtype=np.uint16)
        for i in range(n):
            doc = rng.choice([t for t in range(4, vocab)], lengths[i])
            if labels[i]:
                doc[rng.integers(0, lengths[i])] = 3
            tokens[i, :lengths[i]] = doc
        splits[split] = {"tokens": tokens, "length": lengths.astype(np.int32), "label": labels.astype(np.int64),
                         "id": [f"{split}-{i}" for i in range(n)]}
    return write_splits(root, columns, splits, per_shard=40, kind="text", task="classification", num_classes=2,
                        class_names=["without", "with"],
                        tokenizer={"kind": "byte-test", "vocab_size": vocab, "eos_id": 0, "pad_id": 1})


def make_regression(root: Path, *, sizes=(160, 40, 40), dim: int = 6, seed: int = 0):
    """y = w . x + 50 + noise, targets stored raw (the trainer normalises with the train split's stats)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=dim) * 10
    columns = [Column("features", "ndarray", "input", "float32", (dim,)), Column("target", "ndarray", "target", "float32"),
               Column("id", "str", "id")]
    splits, train_y = {}, None
    for split, n in zip(SPLITS, sizes):
        x = rng.normal(size=(n, dim)).astype(np.float32)
        y = (x @ w + 50 + rng.normal(size=n)).astype(np.float32)
        train_y = y if train_y is None else train_y
        splits[split] = {"features": x, "target": y, "id": [f"{split}-{i}" for i in range(n)]}
    return write_splits(root, columns, splits, per_shard=64, kind="table", task="regression",
                        feature_columns=[f"x{i}" for i in range(dim)], feature_shape=[dim],
                        target_normalisation={"mean": float(train_y.mean()), "std": float(train_y.std())})


def make_multilabel(root: Path, *, sizes=(160, 40, 40), dim: int = 6, labels: int = 3, seed: int = 0):
    """Label j is on when feature j is positive (plus a little label noise)."""
    rng = np.random.default_rng(seed)
    columns = [Column("features", "ndarray", "input", "float32", (dim,)),
               Column("target", "ndarray", "target", "float32", (labels,)), Column("id", "str", "id")]
    splits = {}
    for split, n in zip(SPLITS, sizes):
        x = rng.normal(size=(n, dim)).astype(np.float32)
        y = (x[:, :labels] > 0) ^ (rng.random((n, labels)) < 0.03)
        splits[split] = {"features": x, "target": y.astype(np.float32), "id": [f"{split}-{i}" for i in range(n)]}
    names = [f"tag{j}" for j in range(labels)]
    return write_splits(root, columns, splits, per_shard=64, kind="table", task="multilabel",
                        feature_columns=[f"x{i}" for i in range(dim)], feature_shape=[dim], target_names=names,
                        num_classes=labels)


def config(root: Path, manifest: dict, locations: dict, name: str, *, model: str, model_kwargs: dict, task: str,
           train: dict | None = None, validation: dict | None = None, **extra) -> dict:
    return {
        "model": {"name": model, "kwargs": model_kwargs},
        "data": {"commit_id": "c0ffee", "manifest": manifest, "locations": locations},
        "train": {"epochs": 3, "batch_size": 16, "lr": 0.01, "seed": 0, "num_workers": 1, "prefetch_batches": 2,
                  **(train or {})},
        "checkpoint": {"dir": str(root / name / "ckpt"), "every_steps": 4, "keep_last": 2},
        "output_dir": str(root / name / "out"),
        "telemetry": {"every_steps": 2},
        "task": task,
        "validation": validation or {},
        **extra,
    }
