"""The training step's failure, from the records the runtime's ranks leave beside the checkpoints:
one a new attempt would repeat fails the step with no retry of its RetryPolicy, in the runtime's
words; one a new attempt can fix is retried. (Real torchrun runs write the records in
tests/runtime/test_guards_torchrun.py and test_user_loop_guards.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import dagster as dg
import pytest

from core.spec import model_pipeline
from ops.training import training_failure
from pipelines.models.digits import digits_pipeline, write_digits_source
from resources.launch.base import TrainingJob, TrainingLauncher
from tests.pipeline.conftest import failure_messages, platform  # noqa: F401 (platform is a fixture)
from training_runtime.checkpoint.full import pinned
from training_runtime.observe.attempts import (
    RETRYABLE,
    AttemptId,
    AttemptLog,
    attempts_root,
    next_launch,
    read_attempts,
)
from training_runtime.observe.guards import Detection, NonFiniteLoss
from training_runtime.train.failures import failure_record

SPEC = model_pipeline("toy", source="x.csv", features=["a"], label="y", classes=["p", "q"])
NAN = Detection("nonfinite", "error", 26, "non-finite loss at step 26 on rank 0; training stopped; last good checkpoint "
                "step_000000025 kept in /w/checkpoints", rank=0)
HANG = Detection("hang", "error", 12, "hang: rank 1 finished no training step for 300 s after step 12", rank=1)


class RecordsOnly(TrainingLauncher):
    def launch(self, context, job):
        raise AssertionError("not launched in these tests")


def _job(work: Path, launch: int) -> TrainingJob:
    return TrainingJob(name="toy-job", nproc_per_node=2, config={
        "checkpoint": {"dir": str(work / "checkpoints")}, "launch": launch})


def _write(work: Path, launch: int, record: dict, detection: Detection | None = None) -> None:
    log = AttemptLog(attempts_root(work / "checkpoints"), AttemptId(launch, 0, "run"), rank=0)
    log.start(world_size=1)
    if detection is not None:
        log.add_detection(detection.to_dict())
    log.add_failure(record)


def _run_step(outcome) -> tuple[list[int], dg.ExecuteInProcessResult]:
    tries: list[int] = []

    @dg.op(retry_policy=dg.RetryPolicy(max_retries=1))
    def distributed_training(context):
        tries.append(context.retry_number)
        raise training_failure(context, SPEC, outcome)

    @dg.job
    def training():
        distributed_training()

    return tries, training.execute_in_process(raise_on_error=False)


def test_a_failure_that_would_repeat_fails_the_step_once_in_the_runtimes_words(tmp_path):
    _write(tmp_path, 1, failure_record(NonFiniteLoss(NAN, "step_000000025")), NAN)
    outcome = RecordsOnly().failure_of(_job(tmp_path, 1))
    assert outcome.deterministic and outcome.last_good_checkpoint == "step_000000025"
    tries, result = _run_step(outcome)
    assert tries == [0]  # no retry
    (failure,) = result.get_step_failure_events()
    message = failure.step_failure_data.user_failure_data.description
    assert message.startswith("training 'toy' failed, not retried (a new attempt would fail the same way): "
                              "non-finite loss at step 26 on rank 0")
    assert "last good checkpoint step_000000025 kept" in message
    metadata = failure.step_failure_data.user_failure_data.metadata
    assert metadata["last_good_checkpoint"].value == "step_000000025"
    assert metadata["attempts"].value[0]["ended"] == "failed"


def test_a_failure_a_new_attempt_can_fix_is_retried_and_says_so(tmp_path):
    _write(tmp_path, 1, {"kind": RETRYABLE, "cause": "hang", "message": HANG.message, "detection": HANG.to_dict()},
           HANG)
    outcome = RecordsOnly().failure_of(_job(tmp_path, 1))
    assert not outcome.deterministic
    tries, result = _run_step(outcome)
    assert tries == [0, 1]  # the step's RetryPolicy ran it again
    message = result.get_step_failure_events()[-1].step_failure_data.user_failure_data.description
    assert message.startswith("training 'toy' failed: hang: rank 1 finished no training step for 300 s")
    assert message.endswith("a retry resumes from the last checkpoint")


def test_each_launch_reads_only_its_own_attempts(tmp_path):
    _write(tmp_path, 1, failure_record(NonFiniteLoss(NAN, None)), NAN)
    assert next_launch(attempts_root(tmp_path / "checkpoints")) == 2
    assert RecordsOnly().failure_of(_job(tmp_path, 2)) is None  # this launch left nothing: the error stands


@pytest.mark.slow
def test_a_nan_in_a_real_training_fails_the_step_once_keeping_its_last_good_checkpoint(platform):
    """The digits pipeline with a learning rate that overflows at the second step: torchrun does
    not restart it, Dagster does not retry the step, and the error is the runtime's."""
    write_digits_source(platform.sources)
    recipe = dataclasses.replace(digits_pipeline.recipe, epochs=1, lr=1e37, checkpoint_every_steps=1)
    result = platform.run(dataclasses.replace(digits_pipeline, recipe=recipe))
    assert not result.success
    kinds = [e.event_type_value for e in result.all_events if e.step_key == "digits__checkpoint.digits_distributed_training"]
    assert kinds.count("STEP_FAILURE") == 1 and "STEP_UP_FOR_RETRY" not in kinds
    message = failure_messages(result)
    assert "training 'digits' failed, not retried (a new attempt would fail the same way): non-finite loss at step 2 on " \
           "rank" in message
    assert "last good checkpoint step_000000001 kept" in message
    (root,) = platform.profile.data_root.glob("checkpoints/digits/*/attempts")
    (attempt,) = read_attempts(root)  # one attempt: no torchrun restart
    assert attempt.deterministic and "step_000000001" in pinned(root.parent / "checkpoints")


def test_a_sweep_does_not_restart_a_trial_whose_failure_would_repeat(tmp_path):
    from core.sweep import Choice, Sweep
    from ops.sweep_trials import FAILED, SweepRunner, open_study

    launched: list[int] = []

    def launch(plan) -> dict:
        launched.append(plan.number)
        raise dg.Failure(description="training 'toy' failed, not retried: non-finite loss at step 3 on rank 0",
                         allow_retries=False)

    sweep = Sweep(space={"train.lr": Choice(1e37)}, objective="loss", trials=1, parallelism=1, sampler="random",
                  pruner="none", retries=1)
    study = open_study(f"sqlite:///{tmp_path / 'optuna.sqlite'}", "s", sweep, "minimize")
    result = SweepRunner(sweep, study, objective="loss", trial_root=tmp_path / "trials", launch=launch,
                         log=lambda line: None, poll_s=0.01).run()
    (record,) = result.records
    assert launched == [0] and record.state == FAILED and record.attempts == 1  # not relaunched
    assert "non-finite loss at step 3" in record.error
