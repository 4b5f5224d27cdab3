"""The context's guards in-process (a world of one rank): what a training function reports is
checked as the built-in trainer's figures are, a non-finite loss stops it naming the last good
checkpoint, and metrics.json lists the attempt with its detections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime.helpers import make_config, make_dataset
from training_runtime.checkpoint import full as ckpt
from training_runtime.config import RunConfig
from training_runtime.observe.guards import NonFiniteLoss
from training_runtime.train.context import TrainingContext
from training_runtime.train.user_loop import run_train_fn


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("guarding")
    manifest, locations = make_dataset(root, n_train=64, n_test=16, per_shard=20)
    return root, manifest, locations


def _context(problem, info, name: str, **guards) -> TrainingContext:
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name=name)
    d["guards"] = guards
    return TrainingContext(RunConfig.from_dict(d), info)


def test_a_reported_nan_stops_the_run_naming_step_rank_and_the_last_good_checkpoint(problem, world_of_one):
    ctx = _context(problem, world_of_one, "reported_nan")
    for step in (4, 8):
        ckpt.write_checkpoint(ctx.config.checkpoint.dir, step, {"step": step})
    ctx.report(6, loss=0.5)
    with pytest.raises(NonFiniteLoss) as stopped:
        ctx.report(8, loss=float("nan"))  # checkpoint 8 may hold its weights: the good one is from before
    assert stopped.value.last_good_checkpoint == "step_000000004"
    message = str(stopped.value)
    assert message.startswith("non-finite loss at step 8 on rank 0") and "ctx.report got loss=nan" in message
    assert "training stopped; last good checkpoint step_000000004 kept" in message
    assert list(ckpt.pinned(ctx.config.checkpoint.dir)) == ["step_000000004"]
    assert [d["detector"] for d in ctx.guards.detections] == ["nonfinite"]
    ctx.report(9, accuracy=float("nan"))  # only losses stop a run: a metric may be undefined


def test_reported_losses_feed_the_loss_spike_check_per_interval(problem, world_of_one):
    ctx = _context(problem, world_of_one, "reported_spike", loss_spike_factor=3.0)
    for step in range(1, 9):  # intervals of 2 steps (telemetry.every_steps)
        ctx.report(step, loss=1.0)
    ctx.report(9, loss=10.0)
    ctx.report(10, loss=10.0)
    assert ctx.guards.detections == []  # the spike's interval is judged once it is over
    ctx.report(11, loss=1.0)
    (spike,) = ctx.guards.detections
    assert spike["detector"] == "loss_spike" and spike["step"] == 10 and "10.0x the median 1 of the last 4" in spike["message"]


def _reports_nan(ctx) -> None:
    model = ctx.build_model()
    for _, batches in ctx.epochs(0):
        for step, batch in enumerate(batches, 1):
            ctx.task.forward(model, batch)
            ctx.report(step, loss=float("nan") if step == 3 else 1.0)


def _trains(ctx) -> None:
    model = ctx.build_model()
    step = 0
    for _, batches in ctx.epochs(0):
        for batch in batches:
            outputs, targets = ctx.task.forward(model, batch)
            step += 1
            ctx.report(step, loss=ctx.task.loss(outputs, targets).item())
            if step >= ctx.total_steps:
                break
    ctx.save_model(model)


def test_a_training_function_runs_under_the_guards_and_lists_its_attempt(problem, world_of_one):
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name="guarded_fn")
    d["train_fn"] = "tests.runtime.test_guarding:_trains"
    d["validation"] = {"enabled": False}
    # The data-stall share is timing: on two busy cores the loader's wait passed 30% once (a
    # clean-clone CI run), which this test of the attempt's listing does not judge.
    d["guards"] = {"data_stall_share": None}
    ctx = TrainingContext(RunConfig.from_dict(d), world_of_one)
    metrics = run_train_fn(ctx)
    assert metrics["attempts"] == [{"restart_count": 0, "resumed_from_step": None, "ended": "completed",
                                    "reason": None, "detections": []}]
    written = json.loads((Path(d["output_dir"]) / "metrics.json").read_text())
    assert written["attempts"] == metrics["attempts"] and written["detections"] == []
    assert ctx.guards.watchdog.thread is not None and not ctx.guards.watchdog.thread.is_alive()  # closed after

    d = make_config(root, manifest, locations, name="guarded_nan")
    d["train_fn"] = "tests.runtime.test_guarding:_reports_nan"
    with pytest.raises(NonFiniteLoss, match="non-finite loss at step 3 on rank 0"):
        run_train_fn(TrainingContext(RunConfig.from_dict(d), world_of_one))
