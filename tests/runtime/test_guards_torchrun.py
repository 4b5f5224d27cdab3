"""Faults injected into real 2-rank torchrun trainings (gloo): each is detected, reported with
the step and rank, and has the outcome the guards promise; a clean run reports nothing. A
failure a restart would repeat (a non-finite stop, code that cannot be imported) ends the launch
with no torchrun restart even when restarts are allowed; a hang is restarted and resumes."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.runtime.helpers import judged, make_config, make_dataset, torchrun
from training_runtime.checkpoint.full import pinned
from training_runtime.observe.attempts import attempts_root, launch_outcome, read_attempts


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("guards")
    manifest, locations = make_dataset(root)
    return root, manifest, locations


def _metrics(cfg) -> dict:
    return json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())


def _checkpoints(cfg) -> list[str]:
    return sorted(p.name for p in Path(cfg["checkpoint"]["dir"]).iterdir() if p.name.startswith("step_"))


def _nan_model(step: int, rank: int) -> dict:
    return {"model": "tests.runtime.user_model:nan_at_step", "model_kwargs": {"step": step, "rank": rank}}


def _attempts(cfg):
    return read_attempts(attempts_root(cfg["checkpoint"]["dir"]))


def test_a_nan_loss_stops_the_run_at_once_naming_step_and_rank_and_keeps_the_good_checkpoints(problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="nan", **_nan_model(step=10, rank=1))
    cfg["guards"] = {"hang_timeout_s": 60.0}
    proc = torchrun(cfg, root / "nan.json", max_restarts=1)  # a restart is allowed, and not taken
    assert proc.returncode != 0
    assert "non-finite loss at step 10 on rank 1" in proc.stderr
    assert "NonFiniteLoss" in proc.stderr
    assert "stopping torchrun's agent" in proc.stderr
    # Checkpoints 4 and 8 were written before the bad step; none after it.
    assert _checkpoints(cfg) == ["step_000000004", "step_000000008"]
    assert not (Path(cfg["output_dir"]) / "model.safetensors").exists()  # nothing half-published
    # One attempt, recorded as failed for good, naming the step, the rank and the checkpoint it kept.
    (attempt,) = _attempts(cfg)  # one attempt: a restart would have left its own record
    assert (attempt.ended, attempt.id.restart, attempt.deterministic) == ("failed", 0, True)
    outcome = launch_outcome(attempts_root(cfg["checkpoint"]["dir"]), 1)
    assert outcome.deterministic and outcome.last_good_checkpoint == "step_000000008"
    assert "non-finite loss at step 10 on rank 1" in outcome.message
    assert "last good checkpoint step_000000008 kept" in outcome.message
    assert list(pinned(cfg["checkpoint"]["dir"])) == ["step_000000008"]  # no later attempt prunes it
    assert [d["step"] for d in attempt.detections if d["detector"] == "nonfinite"] == [10]


def test_code_that_cannot_be_imported_fails_once_naming_the_module(problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="no_module", model="team_models_not_installed.nets:wide")
    proc = torchrun(cfg, root / "no_module.json", nproc=1, max_restarts=1)
    assert proc.returncode != 0
    (attempt,) = _attempts(cfg)  # one attempt: a restart would have left its own record
    assert attempt.deterministic and attempt.failure["cause"] == "config"
    assert "cannot import module 'team_models_not_installed.nets'" in attempt.reason


def test_a_nan_batch_within_the_skip_allowance_is_skipped_and_recorded(problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="nan_skip", **_nan_model(step=10, rank=1))
    cfg["guards"] = {"nonfinite_skip_batches": 2}
    proc = torchrun(cfg, root / "nan_skip.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _metrics(cfg)
    found = [d for d in m["detections"] if d["detector"] == "nonfinite"]
    assert [(d["step"], d["rank"], d["severity"]) for d in found] == [(10, 1, "warning")]
    assert m["nonfinite_skipped"] == 1 and m["steps"] == 24
    weights = load_file(Path(cfg["output_dir"]) / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())  # the bad step never reached the weights
    assert "guard nonfinite (warning) at step 10" in proc.stderr


def test_a_straggler_and_a_data_stall_are_named(problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="slow")
    cfg["guards"] = {"straggler_window": 3}
    # A batch every 0.25 s: on two busy cores a step can take over 0.12 s, and the loader kept up.
    proc = torchrun(cfg, root / "slow.json", env={"TRAINING_RUNTIME_FAULT_SLOW_RANK": "1:0.04",
                                                  "TRAINING_RUNTIME_FAULT_SLOW_LOADER": "0.25"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _metrics(cfg)
    by_kind = {}
    for d in m["detections"]:
        by_kind.setdefault(d["detector"], []).append(d)
    assert {d["rank"] for d in by_kind["straggler"]} == {1}
    assert "rank 1" in by_kind["straggler"][0]["message"] and by_kind["straggler"][0]["host"]
    stall = by_kind["data_stall"][0]
    assert "recipe.loader_threads (now 1)" in stall["message"] and stall["severity"] == "warning"
    # Warnings are rate-limited per detector and rank (24 steps, repeated after 10 intervals of 2 steps),
    # not repeated every interval.
    for rank in (0, 1):
        assert len([d for d in by_kind["data_stall"] if d["rank"] == rank]) <= 2
    assert m["steps"] == 24  # warnings do not stop the run


def test_a_stopped_rank_is_a_hang_the_watchdog_fails_with_stacks_and_the_restart_resumes(problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="hang")
    cfg["guards"] = {"hang_timeout_s": 6.0}
    cfg["train"]["collective_timeout_s"] = 120.0
    proc = torchrun(cfg, root / "hang.json", max_restarts=1, timeout=240,
                    env={"TRAINING_RUNTIME_FAULT_STOP_AT_STEP": "1:10"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "hang: rank 0 finished no training step for" in proc.stderr
    assert "Thread 0x" in proc.stderr and "(most recent call first)" in proc.stderr  # faulthandler's stacks
    m = _metrics(cfg)
    assert "killed stopped peer process" in proc.stderr  # the restart did not wait out torchrun's grace period
    assert m["restart_count"] == 1 and m["resumed_from_step"] == 8 and m["steps"] == 24
    # Both attempts are in metrics.json, the hang detected by the first among the run's detections.
    first, second = m["attempts"]
    assert (first["restart_count"], first["ended"], first["resumed_from_step"]) == (0, "restarted", None)
    assert first["reason"].startswith("hang: rank 0 finished no training step") and "rank(s) 1" in first["reason"]
    assert [d["detector"] for d in judged(first["detections"])] == ["hang"]
    assert second == {"restart_count": 1, "resumed_from_step": 8, "ended": "completed", "reason": None,
                      "world_size": 2, "started_at": second["started_at"], "name": second["name"],
                      "detections": second["detections"]}
    assert second["name"].startswith("L001-R001-") and second["started_at"] > first["started_at"]
    assert [(d["detector"], d["attempt"]) for d in m["detections"] if d["detector"] == "hang"] == [("hang", 1)]
