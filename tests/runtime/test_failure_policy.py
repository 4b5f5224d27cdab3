"""What a retry can fix: the classification of a rank's failure, the attempt records read back
(how each attempt ended and why), the refusal of a restart after a failure that would repeat,
and the pinned last good checkpoint that pruning keeps."""

from __future__ import annotations

import json

import pytest
import torch

from training_runtime.checkpoint import full as ckpt
from training_runtime.config import ConfigError
from training_runtime.data.shards import DataError
from training_runtime.observe.attempts import (
    DETERMINISTIC,
    RETRYABLE,
    AttemptId,
    AttemptLog,
    attempts_root,
    current_attempt,
    launch_outcome,
    metrics_attempts,
    next_launch,
    read_attempts,
)
from training_runtime.observe.build_info import CodeVersionMismatch
from training_runtime.observe.error_file import stop_elastic_agent
from training_runtime.observe.guards import Detection, NonFiniteLoss
from training_runtime.train.failures import (
    FailureRecorder,
    RestartRefused,
    TrainFnError,
    TrainingPreempted,
    classify,
    failure_record,
)

NAN = Detection("nonfinite", "error", 26, "non-finite loss at step 26 on rank 0; last good checkpoint "
                "step_000000025 kept in /ckpt", rank=0)


@pytest.mark.parametrize("exc, kind, cause", [
    (NonFiniteLoss(NAN, "step_000000025"), DETERMINISTIC, "non-finite"),
    (ConfigError("train_fn 'team.loop:main': cannot import module 'team.loop'"), DETERMINISTIC, "config"),
    (CodeVersionMismatch("the image was built from commit a, the run is b"), DETERMINISTIC, "config"),
    (ModuleNotFoundError("No module named 'team'"), DETERMINISTIC, "import"),
    (TrainFnError("train_fn returned without saving a model"), DETERMINISTIC, "train_fn"),
    (TypeError("main() takes 0 positional arguments but 1 was given"), DETERMINISTIC, "code"),
    (KeyError("features"), DETERMINISTIC, "code"),
    (RestartRefused("not restarted"), DETERMINISTIC, "refused"),
    (TrainingPreempted("stopped on SIGTERM after saving checkpoint 40"), RETRYABLE, "preempted"),
    (RuntimeError("[gloo] Connection closed by peer"), RETRYABLE, "error"),  # a peer died: its own record says why
    (DataError("cannot download shard s3://b/k: endpoint unreachable"), RETRYABLE, "error"),
    (OSError(28, "No space left on device"), RETRYABLE, "error"),
    (torch.OutOfMemoryError("CUDA out of memory"), RETRYABLE, "error"),
])
def test_failures_are_classified_by_whether_a_new_attempt_can_fix_them(exc, kind, cause):
    assert classify(exc) == (kind, cause)


def test_a_failure_record_keeps_the_runtimes_words_and_where_code_failed():
    record = failure_record(NonFiniteLoss(NAN, "step_000000025"))
    assert record["message"] == NAN.message and record["step"] == 26
    assert record["last_good_checkpoint"] == "step_000000025" and record["detection"]["rank"] == 0
    try:
        {}["features"]
    except KeyError as e:
        bug = failure_record(e)
    assert bug["kind"] == DETERMINISTIC and bug["message"].startswith("KeyError: 'features' (raised at ")
    assert "test_failure_policy.py" in bug["message"]


def _log(root, launch, restart, rank, run="run-a") -> AttemptLog:
    return AttemptLog(root, AttemptId(launch, restart, run), rank)


def test_attempts_read_back_say_how_each_ended_and_why(tmp_path):
    first = _log(tmp_path, 1, 0, 0)
    first.start(world_size=2)
    hang = Detection("hang", "error", 10, "hang: rank 0 finished no training step for 6 s after step 10", rank=0)
    first.add_detection(hang.to_dict())
    first.add_failure({"kind": RETRYABLE, "cause": "hang", "message": hang.message, "detection": hang.to_dict()})
    second = _log(tmp_path, 1, 1, 0)
    second.start(world_size=2)
    second.update(resumed_from_step=8)
    spike = Detection("loss_spike", "warning", 14, "loss spike at step 14")
    second.add_detection(spike.to_dict())
    with open(second.dir / "rank0.detections.jsonl", "a") as f:
        f.write('{"detector": "torn')  # a line cut by a kill mid-write is skipped, the ones before it stand
    second.update(completed=True)

    a, b = read_attempts(tmp_path)
    assert (a.ended, b.ended) == ("restarted", "completed")
    assert a.reason.startswith("hang: rank 0 finished") and "rank(s) 1 ended without recording a failure" in a.reason
    attempts, detections = metrics_attempts([a, b])
    assert [x.pop("started_at") for x in attempts] == [a.started_at, b.started_at]
    assert attempts == [
        {"restart_count": 0, "resumed_from_step": None, "world_size": 2, "name": "L001-R000-run-a",
         "ended": "restarted", "reason": a.reason, "detections": [hang.to_dict()]},
        {"restart_count": 1, "resumed_from_step": 8, "world_size": 2, "name": "L001-R001-run-a",
         "ended": "completed", "reason": None,
         "detections": [spike.to_dict()]}]
    assert [(d["detector"], d["attempt"]) for d in detections] == [("hang", 1), ("loss_spike", 2)]
    assert next_launch(tmp_path) == 2 and next_launch(tmp_path / "none") == 1


def test_the_rank_that_went_bad_explains_the_launch_not_its_peers_collective_error(tmp_path):
    log0, log1 = _log(tmp_path, 3, 0, 0), _log(tmp_path, 3, 0, 1)
    log0.start(world_size=2)
    log0.add_failure({"kind": RETRYABLE, "cause": "error", "message": "RuntimeError: Connection closed by peer"})
    log1.add_failure(failure_record(NonFiniteLoss(NAN, "step_000000025")))
    outcome = launch_outcome(tmp_path, 3)
    assert outcome.deterministic and outcome.message == NAN.message
    assert outcome.last_good_checkpoint == "step_000000025" and launch_outcome(tmp_path, 4) is None
    (attempt,) = outcome.attempts
    assert attempt.ended == "failed" and attempt.failure["rank"] == 1


def test_a_killed_attempt_that_left_no_failure_is_a_retryable_failure(tmp_path):
    _log(tmp_path, 1, 0, 0).start(world_size=2)
    outcome = launch_outcome(tmp_path, 1)
    assert not outcome.deterministic and "rank(s) 0, 1 ended without recording a failure" in outcome.message


def test_a_restart_after_a_failure_that_repeats_refuses_to_start(tmp_path):
    environ = {"TORCHELASTIC_RUN_ID": "run-a", "TORCHELASTIC_RESTART_COUNT": "1"}
    raw = {"launch": 2, "checkpoint": {"dir": str(tmp_path / "ckpt")}}
    root = attempts_root(raw["checkpoint"]["dir"])
    assert root == tmp_path / "attempts"
    _log(root, 2, 0, 0).add_failure(failure_record(NonFiniteLoss(NAN, None)))
    restart = FailureRecorder.for_config(raw, environ, rank=1)
    assert restart.attempt == AttemptId(2, 1, "run-a") == current_attempt(2, environ)
    with pytest.raises(RestartRefused, match="not restarted: attempt L002-R000-run-a failed .*non-finite loss"):
        restart.refuse_restart()
    # Another launch (a retry, a re-execution after a fix) is the user's decision: it starts.
    FailureRecorder.for_config({**raw, "launch": 3}, environ, rank=1).refuse_restart()
    # Outside torchrun nothing is recorded, and there is no agent to stop.
    assert FailureRecorder.for_config(raw, {}, rank=0).log is None
    assert stop_elastic_agent({}) is False


def test_a_recorded_failure_is_written_where_the_orchestrator_reads_it(tmp_path):
    environ = {"TORCHELASTIC_RUN_ID": "run-b", "TORCHELASTIC_RESTART_COUNT": "0"}
    raw = {"checkpoint": {"dir": str(tmp_path / "ckpt")}}
    at_exit = []
    recorder = FailureRecorder.for_config(raw, environ, rank=0, at_exit=lambda *call: at_exit.append(call))
    recorder.record(ConfigError("train_fn 'team.loop:main': cannot import module 'team.loop' (No module named "
                                "'team')"))
    (attempt,) = read_attempts(tmp_path / "attempts")
    assert attempt.deterministic and "No module named 'team'" in attempt.reason
    # torchrun's agent is stopped at exit (after the traceback is printed), once.
    recorder.record(ConfigError("a second error of the same rank"))
    assert at_exit == [(stop_elastic_agent, environ, str(recorder.log.dir))]


def test_pruning_never_deletes_a_pinned_checkpoint(tmp_path):
    for step in (4, 8, 12, 16):
        ckpt.write_checkpoint(tmp_path, step, {"step": step})
    ckpt.pin(tmp_path, 4, "the last good checkpoint of a non-finite stop")
    removed = ckpt.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["step_000000008"]
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [16, 12, 4]
    assert json.loads((tmp_path / ckpt.PINS_FILE).read_text()) == {
        "step_000000004": "the last good checkpoint of a non-finite stop"}
