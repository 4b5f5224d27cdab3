"""Writes the fixture of an old model version made from shard format v1 (``tests/data/v1_version/``).

Run at commit d0638fe, the last one with the v1 loader (``training_runtime/data/v1.py``: SplitData +
PrefetchLoader), to record what that loader gave; the files it wrote are committed and
``tests/data/test_v1_versions.py`` checks that the one data path of today reads the same shards,
evaluates the old weights to the same figures and retrains to the same model:

    .venv/bin/python -m tests.data.v1_version.make_version

What it makes, as the platform of that time made a classification version:
- ``shards/``: v1 shards written by ``assets.sharding.build_shards`` (the v1 writer of the shards
  asset: seeded split by id, normalisation fitted on train, float32 features then int64 labels);
- ``config.json``: the runtime config of the training, with ``{FIXTURE}`` and ``{WORK}`` for its
  paths (the test fills them in);
- ``output/``: what ``python -m training_runtime`` wrote (weights, model card, metrics; not the
  resolved config, which holds the training's temporary paths);
- ``recorded.json``: the figures to reproduce: the training's loss history, the evaluation of the
  written weights on test and validation (``training_runtime.serve.evaluate``), and the sha256 of
  every shard and of the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FEATURES = tuple(f"x{i}" for i in range(6))
CLASSES = ("a", "b", "c")
OUTPUT_FILES = ("model.safetensors", "model_card.json", "metrics.json")  # resolved_config.json holds tmp paths


def source_frame(rows: int = 240, seed: int = 11) -> pd.DataFrame:
    """A learnable table: the label is the argmax of a fixed linear map of the features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(FEATURES))).astype(np.float32) * 3 + 1
    w = rng.normal(size=(len(FEATURES), len(CLASSES)))
    frame = pd.DataFrame(x, columns=list(FEATURES))
    frame["label"] = [CLASSES[i] for i in np.argmax(x @ w, axis=1)]
    frame["id"] = [f"row-{i:04d}" for i in range(rows)]
    return frame


def config(manifest: dict, fixture: str, work: str) -> dict:
    """The runtime config of the training: shards under ``fixture``, checkpoints and outputs under ``work``."""
    locations = {s["path"]: f"file://{fixture}/shards/{s['path']}"
                 for split in manifest["splits"].values() for s in split["shards"]}
    return {
        "model": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
        "data": {"commit_id": "v1-fixture", "manifest": manifest, "locations": locations, "s3_endpoint_url": None},
        "train": {"epochs": 3, "batch_size": 16, "lr": 0.01, "optimizer": "adamw", "seed": 0,
                  "lr_schedule": "cosine", "num_workers": 2, "prefetch_batches": 2},
        "checkpoint": {"dir": f"{work}/ckpt", "every_steps": 10, "keep_last": 2, "async_save": False},
        "output_dir": f"{work}/output",
        "telemetry": {"every_steps": 1},
    }


def train(cfg: dict, work: Path) -> subprocess.CompletedProcess:
    """``python -m training_runtime`` in one process, as the local launcher runs a world of one."""
    path = work / "config.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "training_runtime", "--config", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    from assets.sharding import build_shards
    from training_runtime.serve.evaluate import evaluate

    shards = HERE / "shards"
    shutil.rmtree(shards, ignore_errors=True)
    manifest = build_shards(source_frame(), out_dir=shards, feature_columns=FEATURES, label_column="label",
                            class_names=CLASSES, id_column="id", feature_shape=(len(FEATURES),), seed=5,
                            fractions=(0.6, 0.2, 0.2), samples_per_shard=40)
    (shards / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = config(manifest, str(HERE), str(work))
        done = train(cfg, work)
        if done.returncode != 0:
            raise SystemExit(f"training failed:\n{done.stderr[-3000:]}")
        out = HERE / "output"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        for name in OUTPUT_FILES:
            shutil.copy(work / "output" / name, out / name)
        metrics = json.loads((out / "metrics.json").read_text())
        evaluation = {split: evaluate(out, cfg["data"]["manifest"], cfg["data"]["locations"], split=split)
                      for split in ("test", "validation")}
    (HERE / "config.json").write_text(json.dumps(config(manifest, "{FIXTURE}", "{WORK}"), indent=1, sort_keys=True)
                                      + "\n")
    recorded = {
        "made_at_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                         text=True).stdout.strip(),
        "loader": "training_runtime.data.v1.PrefetchLoader",
        "torch_version": __import__("torch").__version__,
        "steps": metrics["steps"], "final_loss": metrics["final_loss"], "loss_history": metrics["loss_history"],
        "evaluation": evaluation, "weights_sha256": sha256(out / "model.safetensors"),
        "shards_sha256": {s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]},
    }
    (HERE / "recorded.json").write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
