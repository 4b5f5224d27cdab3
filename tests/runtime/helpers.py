"""Tiny synthetic shard datasets and configs for the runtime tests."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def write_split(root: Path, split: str, x: np.ndarray, y: np.ndarray, per_shard: int) -> dict:
    shards = []
    for i, start in enumerate(range(0, len(x), per_shard)):
        xs = np.ascontiguousarray(x[start:start + per_shard], dtype="<f4")
        ys = np.ascontiguousarray(y[start:start + per_shard], dtype="<i8")
        data = xs.tobytes() + ys.tobytes()
        rel = f"shards/{split}/{i:05d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        shards.append({"path": rel, "num_samples": len(xs), "sha256": hashlib.sha256(data).hexdigest(),
                       "num_bytes": len(data)})
    return {"num_samples": len(x), "shards": shards}


def make_dataset(root: Path, *, n_train: int = 192, n_test: int = 64, feature_shape=(16,),
                 num_classes: int = 4, per_shard: int = 50, seed: int = 0) -> tuple[dict, dict]:
    """A learnable problem: labels are the argmax of a fixed linear map of Gaussian features."""
    rng = np.random.default_rng(seed)
    dim = math.prod(feature_shape)
    w = rng.normal(size=(dim, num_classes))
    splits, locations = {}, {}
    for split, n in (("train", n_train), ("validation", n_test), ("test", n_test)):
        x = rng.normal(size=(n, dim)).astype(np.float32)
        y = np.argmax(x @ w, axis=1).astype(np.int64)
        splits[split] = write_split(root, split, x.reshape(n, *feature_shape), y, per_shard)
        for s in splits[split]["shards"]:
            locations[s["path"]] = (root / s["path"]).as_uri()
    manifest = {"format": "model-factory.shards/v1", "feature_shape": list(feature_shape),
                "feature_dtype": "float32", "label_dtype": "int64", "num_classes": num_classes,
                "class_names": [str(i) for i in range(num_classes)], "samples_per_shard": per_shard,
                "splits": splits}
    return manifest, locations


def make_id_dataset(root: Path, n: int, per_shard: int, held_out: int, id_scale: float) -> tuple[dict, dict]:
    """A learnable 8-feature, 4-class problem whose feature 0 is each sample's index / ``id_scale``,
    so a batch says which samples it holds (tests/runtime/sample_order_train.py reads them)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 4))
    splits, locations = {}, {}
    for split, count in (("train", n), ("validation", held_out), ("test", held_out)):
        x = rng.normal(size=(count, 8)).astype(np.float32)
        y = np.argmax(x @ w, axis=1).astype(np.int64)
        x[:, 0] = np.arange(count) / id_scale
        splits[split] = write_split(root, split, x, y, per_shard)
        for s in splits[split]["shards"]:
            locations[s["path"]] = (root / s["path"]).as_uri()
    manifest = {"format": "model-factory.shards/v1", "feature_shape": [8], "feature_dtype": "float32",
                "label_dtype": "int64", "num_classes": 4, "class_names": list("abcd"),
                "samples_per_shard": per_shard, "splits": splits}
    return manifest, locations


def make_config(root: Path, manifest: dict, locations: dict, *, name: str = "run",
                model: str = "mlp", model_kwargs: dict | None = None, **train: Any) -> dict:
    base_train = {"epochs": 2, "batch_size": 16, "lr": 0.01, "optimizer": "adamw", "seed": 0,
                  "lr_schedule": "cosine", "num_workers": 1, "prefetch_batches": 2}
    ckpt = train.pop("checkpoint", {})
    base_train.update(train)
    return {
        "model": {"name": model, "kwargs": model_kwargs if model_kwargs is not None else {"hidden_sizes": [32]}},
        "data": {"commit_id": "c0ffee", "manifest": manifest, "locations": locations,
                 "s3_endpoint_url": None},
        "train": base_train,
        "checkpoint": {"dir": str(root / name / "ckpt"), "every_steps": 4, "keep_last": 3,
                       "async_save": False, **ckpt},
        "output_dir": str(root / name / "out"),
        "telemetry": {"every_steps": 2},
    }


# Warnings judged from timings: on two busy cores a loader or a rank may be slow for a while in
# any run, so a test of another detector leaves these out of the list it compares.
TIMING_DETECTORS = frozenset({"data_stall", "straggler"})


def judged(detections: list[dict]) -> list[dict]:
    """The detections a test of hangs, NaNs and restarts compares: all but the timing warnings."""
    return [d for d in detections if d["detector"] not in TIMING_DETECTORS]


def torchrun(config: dict, path: Path, *, nproc: int = 2, max_restarts: int = 0,
             env: dict[str, str] | None = None, timeout: float = 180,
             python_path: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """``python_path``: folders beside the repository that the workers import from (a team's
    code kept outside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(map(str, (REPO, *python_path))), **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={max_restarts}", "--monitor-interval=0.2", "-m", "training_runtime",
           "--config", str(path)]
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def registered_sha256(output_dir: str | Path) -> str:
    """The sha256 a model version registers for a run's weights: the card's, checked against the
    bytes of model.safetensors. Equal weights must give equal values (tests/runtime/
    test_byte_stable_artifacts.py), so resumed runs are compared by it, not only tensor by tensor."""
    out = Path(output_dir)
    card = json.loads((out / "model_card.json").read_text())
    written = hashlib.sha256((out / card["weights"]["file"]).read_bytes()).hexdigest()
    assert written == card["weights"]["sha256"], f"{out}: the card's sha256 is not that of the weights file"
    return written
