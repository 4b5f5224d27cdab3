"""A training worker SIGKILLed at random points (mid-step and mid-checkpoint-write) resumes from the
last valid checkpoint and ends with the weights of an uninterrupted run, tensor for tensor and by the
sha256 a model version would register for them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from safetensors.torch import load_file

from tests.reliability.conftest import repeats
from tests.runtime.helpers import make_config, make_dataset, registered_sha256, torchrun
from training_runtime.checkpoint.full import list_checkpoints, verify_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    manifest, locations = make_dataset(root, n_train=256, n_test=64)
    base = make_config(root, manifest, locations, name="baseline", epochs=3, checkpoint={"every_steps": 2})
    done = torchrun(base, root / "baseline.json")
    assert done.returncode == 0, done.stderr[-3000:]
    return root, manifest, locations, _Weights(load_file(Path(base["output_dir"]) / "model.safetensors"),
                                               registered_sha256(base["output_dir"]))


def _nothing_lost(config: dict) -> bool:
    ckpt = Path(config["checkpoint"]["dir"])
    leftovers = [p.name for p in ckpt.iterdir() if p.name.startswith((".tmp", ".trash"))]
    for _, path in list_checkpoints(ckpt):
        verify_checkpoint(path)
    return not leftovers


class _Weights(NamedTuple):
    tensors: dict
    sha256: str  # what registering the run's model would record


def _same_weights(config: dict, expected: _Weights) -> bool:
    """Tensor for tensor equal to the uninterrupted run's, and so the same registered sha256."""
    out = Path(config["output_dir"])
    if not (out / "model.safetensors").is_file():
        return False
    weights = load_file(out / "model.safetensors")
    return (weights.keys() == expected.tensors.keys() and all(torch.equal(weights[k], expected.tensors[k])
                                                              for k in weights)
            and registered_sha256(out) == expected.sha256)


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_worker_killed_mid_step_resumes_to_the_same_weights(problem, ledger, case):
    root, manifest, locations, expected = problem
    steps_total = 3 * (256 // (16 * 2))  # epochs x steps per epoch at global batch 32
    step = random.Random(case).randrange(1, steps_total)
    rank = case % 2
    cfg = make_config(root, manifest, locations, name=f"kill-step-{case}", epochs=3, checkpoint={"every_steps": 2})
    done = torchrun(cfg, root / f"kill-step-{case}.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"{rank}:{step}"})
    ok = done.returncode == 0 and _same_weights(cfg, expected)
    ledger.record("fault: worker SIGKILL mid-step", ok, _nothing_lost(cfg), f"rank {rank} killed after a random step")
    assert ok, done.stderr[-3000:]


# make reliability runs it (all its cases); make test keeps the kill mid-step (same resume path).
@pytest.mark.heavy
@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_worker_killed_mid_checkpoint_write_resumes_to_the_same_weights(problem, ledger, case):
    """Rank 0 (the writer) SIGKILLs itself inside the write of a random checkpoint: the state file
    is on disk, the manifest and the publishing rename are not. Odd cases save asynchronously
    (the kill lands in the writer thread while training goes on)."""
    root, manifest, locations, expected = problem
    step = random.Random(100 + case).randrange(4, 24, 2)  # checkpoints every 2 of 24 steps
    async_save = case % 2 == 1
    cfg = make_config(root, manifest, locations, name=f"kill-ckpt-{case}", epochs=3,
                      checkpoint={"every_steps": 2, "async_save": async_save})
    done = torchrun(cfg, root / f"kill-ckpt-{case}.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"0:{step}:checkpoint"})
    out = Path(cfg["output_dir"])
    resumed = json.loads((out / "metrics.json").read_text()).get("resumed_from_step") if done.returncode == 0 else None
    # The half-written checkpoint was never published: the restart resumes from the one before it.
    ok = done.returncode == 0 and _same_weights(cfg, expected) and resumed == step - 2
    ledger.record("fault: worker SIGKILL mid-checkpoint-write", ok, _nothing_lost(cfg),
                  "rank 0 killed inside a random checkpoint's write (state file written, not published); "
                  "sync and async saves")
    assert done.returncode == 0, done.stderr[-3000:]
    assert resumed == step - 2, f"killed writing checkpoint {step}, resumed from {resumed}"
    assert _same_weights(cfg, expected)
