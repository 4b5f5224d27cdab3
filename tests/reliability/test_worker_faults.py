"""A training worker SIGKILLed at random points (mid-step and mid-checkpoint-write) resumes from the
last valid checkpoint and ends with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.reliability.conftest import repeats
from tests.runtime.helpers import REPO, make_config, make_dataset, torchrun
from training_runtime.checkpoint import list_checkpoints, verify_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    manifest, locations = make_dataset(root, n_train=256, n_test=64)
    base = make_config(root, manifest, locations, name="baseline", epochs=3, checkpoint={"every_steps": 2})
    done = torchrun(base, root / "baseline.json")
    assert done.returncode == 0, done.stderr[-3000:]
    return root, manifest, locations, torch.load(Path(base["output_dir"]) / "weights.pt", weights_only=True)


def _nothing_lost(config: dict) -> bool:
    ckpt = Path(config["checkpoint"]["dir"])
    leftovers = [p.name for p in ckpt.iterdir() if p.name.startswith((".tmp", ".trash"))]
    for _, path in list_checkpoints(ckpt):
        verify_checkpoint(path)
    return not leftovers


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4) for k in a)


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_worker_killed_mid_step_resumes_to_the_same_weights(problem, ledger, case):
    root, manifest, locations, expected = problem
    steps_total = 3 * (256 // (16 * 2))  # epochs x steps per epoch at global batch 32
    step = random.Random(case).randrange(1, steps_total)
    rank = case % 2
    cfg = make_config(root, manifest, locations, name=f"kill-step-{case}", epochs=3, checkpoint={"every_steps": 2})
    done = torchrun(cfg, root / f"kill-step-{case}.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"{rank}:{step}"})
    weights = torch.load(Path(cfg["output_dir"]) / "weights.pt", weights_only=True) if done.returncode == 0 else {}
    ok = done.returncode == 0 and _same_weights(weights, expected)
    ledger.record("fault: worker SIGKILL mid-step", ok, _nothing_lost(cfg), f"rank {rank} killed after a random step")
    assert ok, done.stderr[-3000:]


def _rank(p: psutil.Process) -> str | None:
    try:
        return p.environ().get("RANK")
    except psutil.Error:
        return None


def _kill_a_worker_when(config_dir: Path, proc: subprocess.Popen, delay: float, killed: list) -> None:
    """SIGKILL one torchrun worker after ``delay`` s, preferring a moment when a checkpoint is
    being written (a .tmp directory exists)."""
    deadline = time.monotonic() + delay
    while proc.poll() is None:
        writing = any(p.name.startswith(".tmp") for p in config_dir.iterdir()) if config_dir.exists() else False
        if writing or time.monotonic() > deadline:
            workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                       if "training_runtime" in " ".join(c.cmdline())]
            if workers:
                # Rank 0 writes checkpoints: kill it when one is being written.
                target = next((w for w in workers if _rank(w) == "0"), workers[0]) if writing else workers[0]
                target.send_signal(signal.SIGKILL)
                killed.append("mid-checkpoint" if writing else "at a random time")
                return
        time.sleep(0.002)


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_worker_killed_mid_checkpoint_write_resumes_to_the_same_weights(problem, ledger, case):
    root, manifest, locations, expected = problem
    cfg = make_config(root, manifest, locations, name=f"kill-ckpt-{case}", epochs=3, checkpoint={"every_steps": 2})
    path = root / f"kill-ckpt-{case}.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=2",
           "--monitor-interval=0.2", "-m", "training_runtime", "--config", str(path)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[str] = []
    delay = random.Random(100 + case).uniform(2.0, 6.0)
    watcher = threading.Thread(target=_kill_a_worker_when, args=(Path(cfg["checkpoint"]["dir"]), proc, delay, killed))
    watcher.start()
    _, err = proc.communicate(timeout=300)
    watcher.join()
    weights = torch.load(Path(cfg["output_dir"]) / "weights.pt", weights_only=True) if proc.returncode == 0 else {}
    ok = proc.returncode == 0 and _same_weights(weights, expected)
    ledger.record("fault: worker SIGKILL mid-checkpoint-write", ok, _nothing_lost(cfg),
                  f"killed {killed[0] if killed else 'never (run ended first)'}")
    assert ok, err[-3000:]
