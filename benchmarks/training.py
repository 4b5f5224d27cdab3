"""Runs of the real training runtime (``torchrun -m training_runtime``) for the scaling figure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, ProbeError
from benchmarks.datagen import locations

MODEL = {"name": "mlp", "kwargs": {"hidden_sizes": [1024, 1024]}}


def runtime_config(data: Path, manifest: dict, work: Path, *, global_batch: int, max_steps: int | None,
                   epochs: int = 1000, checkpoint_every: int = 10**6) -> dict:
    return {
        "model": MODEL,
        "data": {"commit_id": "benchmark", "manifest": manifest, "locations": locations(data, manifest)},
        "train": {"epochs": epochs, "batch_size": global_batch, "lr": 1e-3, "optimizer": "adamw",
                  "max_steps": max_steps, "seed": 0},
        "checkpoint": {"dir": str(work / "checkpoints"), "every_steps": checkpoint_every},
        "output_dir": str(work / "output"),
        "telemetry": {"every_steps": 10},
    }


def torchrun(config: dict, work: Path, nproc: int, *, timeout: float, threads_per_rank: int = 1) -> dict:
    """Train under torchrun with ``nproc`` gloo ranks; returns metrics.json plus the wall time."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg_path = work / "config.json"
    cfg_path.write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "training_runtime", "--config", str(cfg_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads_per_rank)}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
    wall = time.perf_counter() - t0
    metrics_file = work / "output" / "metrics.json"
    if p.returncode != 0 or not metrics_file.exists():
        raise ProbeError(f"torchrun with {nproc} rank(s) exited {p.returncode}: {p.stderr[-1500:]}")
    metrics = json.loads(metrics_file.read_text())
    metrics["launch_wall_s"] = wall
    return metrics
