"""What a user is shown when a training restarts or fails (issue 45): a restarted attempt's Pipes
messages read as that attempt's (no "unexpected message received after closed"), metrics.json's
``reported`` keeps every attempt's figures marked by attempt, a hang's stacks reach the run's
event log, ``training_health`` is a warning naming a fault the training recovered from and an
error for one in the attempt that produced the weights, and a failure's cause is told once, with
no stack trace on the CLI's console and no chained launcher error in the step's failure.

The slow tests run the digits pipeline on a temporary local platform with the runtime's fault
hooks (training_runtime/train/faults.py) set in the environment the workers inherit."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path

import dagster as dg
import pytest
from dagster_pipes import encode_param

from ops.training_health import training_health_result
from pipelines.cli.errors import execute_for_cli, failure_lines
from tests.pipeline.conftest import platform  # noqa: F401 (a fixture)
from training_runtime.observe.attempts import (
    DETERMINISTIC,
    RETRYABLE,
    AttemptId,
    AttemptLog,
    metrics_reported,
    read_attempts,
)
from training_runtime.observe.guards import thread_stacks
from training_runtime.train.failures import FailureRecorder

PIPES_AFTER_CLOSED = "unexpected message received after closed"
HANG = {"detector": "hang", "severity": "error", "step": 6, "rank": 1, "attempt": 1,
        "message": "hang: rank 1 finished no training step for 5 s after step 6"}
STALL = {"detector": "data_stall", "severity": "warning", "step": 8, "rank": 0, "attempt": 2,
         "message": "rank 0 waits for batches 45% of its step time"}


# ------------------------------------------------------------------ training_health
def test_a_recovered_hang_is_a_warning_that_names_the_fault_first():
    metrics = {"attempts": [{"ended": "restarted", "reason": HANG["message"]}, {"ended": "completed"}],
               "detections": [HANG, STALL]}
    result = training_health_result(metrics)
    assert result.severity == dg.AssetCheckSeverity.WARN
    assert result.passed is False  # the stall of attempt 2, the one that made the weights
    assert result.description.startswith("recovered from 1 fault(s): attempt 1 restarted (hang at step 6 on rank 1: "
                                         "hang: rank 1 finished no training step")
    assert "; attempt 2 completed" in result.description
    assert result.metadata["recovered_faults"].value == 1
    alone = training_health_result({**metrics, "detections": [HANG]})
    assert alone.passed is True and alone.description.startswith("recovered from 1 fault(s): attempt 1 restarted "
                                                                 "(hang at step 6")


def test_a_killed_worker_the_training_recovered_from_is_named_by_its_reason():
    killed = "rank(s) 1 ended without recording a failure (killed, out of memory, or their node was lost)"
    result = training_health_result({"attempts": [{"ended": "restarted", "reason": killed}, {"ended": "completed"}],
                                     "detections": []})
    assert result.severity == dg.AssetCheckSeverity.WARN
    assert result.passed is True  # the training recovered: not "did not pass"
    assert result.description == f"recovered from 1 fault(s): attempt 1 restarted ({killed}); attempt 2 completed"


def test_a_fault_in_the_attempt_that_made_the_weights_is_an_error():
    final = dict(HANG, attempt=2, detector="nonfinite", message="non-finite gradient at step 6, batch skipped")
    result = training_health_result({"attempts": [{"ended": "completed"}, {"ended": "completed"}],
                                     "detections": [final]})
    assert result.severity == dg.AssetCheckSeverity.ERROR and result.passed is False
    assert result.description.startswith("1 detection(s): nonfinite at step 6 on rank 1")


def test_warnings_alone_stay_a_warning_and_a_clean_training_passes():
    warned = training_health_result({"attempts": [{"ended": "completed"}], "detections": [dict(STALL, attempt=1)]})
    assert warned.severity == dg.AssetCheckSeverity.WARN and not warned.passed
    clean = training_health_result({"attempts": [{"ended": "completed"}], "detections": []})
    assert clean.passed is True


# ------------------------------------------------------------------ restarts and Pipes
class _Told:
    def __init__(self):
        self.lines: list[str] = []
        self.kinds: list[str] = []
        self.records = 0

    def failed(self, kind: str) -> None:
        self.kinds.append(kind)

    def recorded(self) -> None:
        self.records += 1

    def restarting(self, message: str) -> None:
        self.lines.append(message)


def _recorder(tmp_path: Path, *, restart: int = 0, max_restarts: int = 1, rank: int = 0):
    env = {"TORCHELASTIC_RUN_ID": "run", "TORCHELASTIC_RESTART_COUNT": str(restart),
           "TORCHELASTIC_MAX_RESTARTS": str(max_restarts)}
    told = _Told()
    log = AttemptLog(tmp_path / "attempts", AttemptId(1, restart, "run"), rank)
    return FailureRecorder(log, env, at_exit=lambda *a: None, reporter=told), told


def test_a_retryable_failure_with_restarts_left_tells_the_reporter_a_restart_follows(tmp_path):
    recorder, told = _recorder(tmp_path)
    recorder.record(RuntimeError("Connection closed by peer [127.0.0.1]:29500"))
    (line,) = told.lines
    assert told.records == 1
    assert line.startswith("attempt L001-R000-run ended on rank 0: RuntimeError: Connection closed by peer")
    assert "torchrun restarts the workers (restart 1 of 1)" in line


def test_no_restart_follows_a_deterministic_failure_the_last_restart_or_a_peers_deterministic_one(tmp_path):
    recorder, told = _recorder(tmp_path / "a")
    recorder.record(TypeError("bad call"))  # deterministic: the agent is stopped
    last, told_last = _recorder(tmp_path / "b", restart=1, max_restarts=1)
    last.record(RuntimeError("peer gone"))  # no restart left
    peer, _ = _recorder(tmp_path / "c", rank=1)
    peer.log.add_failure({"kind": DETERMINISTIC, "cause": "code", "message": "KeyError: 'x'"})
    mine, told_mine = _recorder(tmp_path / "c")
    mine.record(RuntimeError("Connection closed by peer"))  # rank 1 stops the agent
    assert told.lines == told_last.lines == told_mine.lines == []


def test_an_elastic_gangs_preempted_rank_keeps_the_session_open_with_no_restart_left_to_count(tmp_path):
    """A grow-back SIGTERMs the workers without spending a restart: with the count at its maximum
    (a node was lost before) the preempted rank 0 still leaves the Pipes session open."""
    from training_runtime.distributed.elastic import ELASTIC_ENV
    from training_runtime.train.failures import TrainingPreempted

    recorder, told = _recorder(tmp_path / "elastic", restart=1, max_restarts=1)
    recorder.environ = {**recorder.environ, ELASTIC_ENV: "1:2"}
    recorder.record(TrainingPreempted("stopped on SIGTERM after saving checkpoint 8"))
    (line,) = told.lines
    assert line == ("attempt L001-R001-run stopped on rank 0 after its checkpoint: the elastic gang re-forms "
                    "(a node joined or left) and resumes from it")
    fixed, told_fixed = _recorder(tmp_path / "fixed", restart=1, max_restarts=1)  # no elastic gang
    fixed.record(TrainingPreempted("stopped on SIGTERM after saving checkpoint 8"))
    assert told_fixed.lines == []  # the last restart: the session closes


def _pipes_env(tmp_path: Path, monkeypatch) -> Path:
    context = {"asset_keys": ["checkpoint"], "code_version_by_asset_key": None, "provenance_by_asset_key": None,
               "partition_key": None, "partition_key_range": None, "partition_time_window": None, "run_id": "r1",
               "job_name": None, "retry_number": 0, "extras": {}}
    messages = tmp_path / "messages.jsonl"
    monkeypatch.setenv("DAGSTER_PIPES_CONTEXT", encode_param({"data": context}))
    monkeypatch.setenv("DAGSTER_PIPES_MESSAGES", encode_param({"path": str(messages)}))
    return messages


def _new_process(monkeypatch) -> None:
    """Each attempt's rank 0 is a new process: dagster_pipes keeps one context per process."""
    from dagster_pipes import PipesContext

    monkeypatch.setattr(PipesContext, "_instance", None)


def test_rank0s_pipes_session_stays_open_for_the_restarted_attempt_and_closes_at_the_real_end(tmp_path, monkeypatch):
    from training_runtime.observe.pipes import PipesReporter

    messages = _pipes_env(tmp_path, monkeypatch)
    _new_process(monkeypatch)
    with pytest.raises(RuntimeError):
        with PipesReporter({}) as first:  # attempt 0: a peer died, torchrun restarts the workers
            first.info("step 5/10")
            first.restarting("attempt L001-R000-run ended on rank 0: peer gone; torchrun restarts the workers")
            raise RuntimeError("peer gone")
    _new_process(monkeypatch)
    with PipesReporter({"TORCHELASTIC_RESTART_COUNT": "1"}) as second:  # attempt 1 runs through
        second.info("step 10/10")
    methods = [json.loads(line)["method"] for line in messages.read_text().splitlines()]
    assert methods == ["opened", "log", "log", "opened", "log", "closed"]  # one "closed": the real end


def test_a_recorded_failure_closes_pipes_without_a_second_copy_of_the_exception(tmp_path, monkeypatch):
    """The orchestrator tells a recorded failure from the attempt's records; the "closed" message
    would otherwise carry it again, which Dagster shows with the rank's stack trace."""
    from training_runtime.observe.pipes import PipesReporter

    messages = _pipes_env(tmp_path, monkeypatch)
    _new_process(monkeypatch)
    with pytest.raises(TypeError):
        with PipesReporter({}) as reporter:
            reporter.recorded()
            raise TypeError("bad call")
    closed = json.loads(messages.read_text().splitlines()[-1])
    assert closed["method"] == "closed" and closed["params"] == {}


def test_dagsters_pipes_handler_reads_both_attempts_without_a_warning(tmp_path, monkeypatch):
    """The message file two attempts of rank 0 leave, read by the launcher's own reader in a real
    Pipes session: every message of the restarted attempt arrives, and none is warned about."""
    from resources.launch.live_telemetry import LiveTempFileMessageReader
    from training_runtime.observe.pipes import PipesReporter

    @dg.op
    def training(context):
        reader = LiveTempFileMessageReader(context=context)
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=reader) as session:
            for key, value in session.get_bootstrap_env_vars().items():
                monkeypatch.setenv(key, value)
            _new_process(monkeypatch)
            with pytest.raises(RuntimeError):
                with PipesReporter({}) as first:
                    first.custom({"kind": "telemetry", "step": 5})
                    first.restarting("attempt L001-R000-run ended on rank 0: peer gone; torchrun restarts")
                    raise RuntimeError("peer gone")
            _new_process(monkeypatch)
            with PipesReporter({"TORCHELASTIC_RESTART_COUNT": "1"}) as second:
                second.custom({"kind": "telemetry", "step": 10})
                second.custom({"kind": "final", "steps": 10})
        return [m["step"] if m["kind"] == "telemetry" else m["kind"] for m in session.get_custom_messages()]

    @dg.job
    def job():
        training()

    with dg.DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert result.output_for_node("training") == [5, 10, "final"]
    assert not [line for line in logs if PIPES_AFTER_CLOSED in line or "did not receive closed" in line]
    assert any("peer gone; torchrun restarts" in line for line in logs)


def test_a_retryable_failure_leaves_the_session_open_whatever_torchruns_count_says(tmp_path, monkeypatch):
    """A fixed gang's pod may be replaced by the Job controller, and an elastic gang re-forms
    without spending a torchrun restart: rank 0 cannot tell whether another attempt follows in
    this session, so a failure a new attempt may fix writes no "closed", recorded or not. A
    deterministic one still closes it."""
    from training_runtime.observe.pipes import PipesReporter

    for exc in (OSError(28, "No space left on device"), RuntimeError("Connection closed by peer")):
        (tmp_path / type(exc).__name__).mkdir()
        messages = _pipes_env(tmp_path / type(exc).__name__, monkeypatch)
        _new_process(monkeypatch)
        with pytest.raises(type(exc)):
            with PipesReporter({"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "1"}) as reporter:
                reporter.info("step 5/10")
                # what FailureRecorder.record tells it (the record written; torchrun has no restart left)
                recorder = FailureRecorder(None, {}, at_exit=lambda *a: None, reporter=reporter)
                recorder.record(exc)
                reporter.recorded()
                raise exc
        assert [json.loads(line)["method"] for line in messages.read_text().splitlines()] == ["opened", "log"]
    (tmp_path / "deterministic").mkdir()
    messages = _pipes_env(tmp_path / "deterministic", monkeypatch)
    _new_process(monkeypatch)
    with pytest.raises(KeyError):
        with PipesReporter({}) as reporter:
            FailureRecorder(None, {}, at_exit=lambda *a: None, reporter=reporter).record(KeyError("label"))
            raise KeyError("label")
    closed = json.loads(messages.read_text().splitlines()[-1])
    assert closed["method"] == "closed" and "exception" in closed["params"]


def _session_log(attempts, monkeypatch) -> tuple[list, list[str]]:
    """Run ``attempts`` (callables given a reporter) as rank 0's successive processes inside one
    real Pipes session read by the launcher's reader: (custom messages, the run's log lines)."""
    from resources.launch.live_telemetry import LiveTempFileMessageReader
    from training_runtime.observe.pipes import PipesReporter

    @dg.op
    def training(context):
        reader = LiveTempFileMessageReader(context=context)
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=reader) as session:
            for key, value in session.get_bootstrap_env_vars().items():
                monkeypatch.setenv(key, value)
            for restart, attempt in enumerate(attempts):
                _new_process(monkeypatch)
                try:
                    with PipesReporter({"TORCHELASTIC_RESTART_COUNT": str(restart)}) as reporter:
                        try:
                            attempt(reporter)
                        except Exception as exc:  # as training_runtime/__main__.py hands it on
                            FailureRecorder(None, {}, at_exit=lambda *a: None, reporter=reporter).record(exc)
                            raise
                except OSError:
                    pass  # this attempt's failure; the launch goes on or ends
        return [m.get("step") for m in session.get_custom_messages()]

    @dg.job
    def job():
        training()

    with dg.DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    return result.output_for_node("training"), logs


def test_a_replacement_attempt_torchrun_did_not_count_is_read_without_a_warning(monkeypatch):
    """The soak's case: a fixed gang's rank 0 fails on a full disk with no torchrun restart left,
    and a replacement pod's rank 0 resumes in the same session."""
    from resources.launch.live_telemetry import CLOSED_FOR_THE_TRAINING

    def failing(reporter):
        reporter.custom({"kind": "telemetry", "step": 5})
        raise OSError(28, "No space left on device")

    def resumed(reporter):
        reporter.custom({"kind": "telemetry", "step": 10})

    steps, logs = _session_log([failing, resumed], monkeypatch)
    assert steps == [5, 10]
    assert not [line for line in logs if PIPES_AFTER_CLOSED in line or "did not receive closed" in line]
    assert CLOSED_FOR_THE_TRAINING not in logs  # the resumed attempt closed it itself


def test_a_session_no_attempt_follows_is_closed_by_the_launcher_with_a_line_that_says_so(monkeypatch):
    from resources.launch.live_telemetry import CLOSED_FOR_THE_TRAINING

    def failing(reporter):
        reporter.custom({"kind": "telemetry", "step": 5})
        raise OSError(28, "No space left on device")

    steps, logs = _session_log([failing], monkeypatch)
    assert steps == [5]
    assert CLOSED_FOR_THE_TRAINING in logs
    assert not [line for line in logs if "did not receive closed" in line or PIPES_AFTER_CLOSED in line]


# ------------------------------------------------------------------ reported figures, stacks
def test_reported_keeps_every_attempts_figures_marked_by_attempt(tmp_path):
    root = tmp_path / "attempts"
    first, second = AttemptId(1, 0, "run"), AttemptId(1, 1, "run")
    log = AttemptLog(root, first, 0)
    log.start(world_size=2)
    for step in (1, 2, 3):
        log.add_reported({"step": step, "loss": 1.0 / step})
    AttemptLog(root, second, 0).start(world_size=2)
    attempts = read_attempts(root)
    reported = metrics_reported(root, attempts, second, [{"step": 3, "loss": 0.3}, {"step": 4, "loss": 0.2}])
    assert [(r["attempt"], r["step"]) for r in reported] == [(1, 1), (1, 2), (1, 3), (2, 3), (2, 4)]


def test_a_hangs_stacks_name_every_other_thread_innermost_frames_first():
    started, stop = threading.Event(), threading.Event()

    def waiting_in_a_collective():
        started.set()
        stop.wait()

    worker = threading.Thread(target=waiting_in_a_collective, name="loader")
    worker.start()
    started.wait()
    try:
        text = thread_stacks(skip=threading.get_ident(), limit=2000)
    finally:
        stop.set()
        worker.join()
    assert "Thread loader (most recent call last):" in text and "waiting_in_a_collective" in text
    assert "Thread MainThread" not in text  # the caller's own thread was skipped
    assert len(text) <= 2000


# ------------------------------------------------------------------ a failure told once
def _failing_job(description: str):
    @dg.op
    def distributed_training(context):
        try:
            raise RuntimeError("External execution process failed with code 1")  # as the launcher raises
        except RuntimeError:
            raise dg.Failure(description=description, allow_retries=False) from None  # as ops/training.py does

    @dg.job
    def training():
        distributed_training()

    return training


def test_the_cli_tells_a_failure_once_with_no_stack_trace(capfd):
    cause = "training 'toy' failed, not retried (a new attempt would fail the same way): non-finite loss at step 2"
    result = execute_for_cli(_failing_job(cause), raise_on_error=False)
    print("\n".join(failure_lines(result)), file=sys.stderr)
    err = capfd.readouterr().err
    assert err.count("non-finite loss at step 2") == 1
    assert err.strip().splitlines()[-1] == f"FAILED distributed_training: {cause}"
    assert "Stack Trace" not in err and "STEP_FAILURE" in err and "RUN_FAILURE" in err


# ------------------------------------------------------------------ the platform, as a user runs it
def _short(spec, **recipe):
    return dataclasses.replace(spec, recipe=dataclasses.replace(spec.recipe, **recipe))


def _train(platform, spec) -> dg.ExecuteInProcessResult:
    """The pipeline up to its checkpoint and the checkpoint's checks (a one-epoch model need not
    pass the quality gate)."""
    result = platform.run_assets(spec, ["raw_dataset", "shards", "checkpoint"])
    assert result.success, [e.event_specific_data.error.message for e in result.all_events if e.is_failure]
    return result


def _step_logs(platform, result) -> list[str]:
    return [e.user_message for e in platform.instance.all_logs(result.run_id)]


def _metrics(platform) -> dict:
    (path,) = platform.profile.data_root.glob("checkpoints/digits/*/output/metrics.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_a_killed_rank_restarts_without_pipes_warnings_keeping_both_attempts_figures(platform, monkeypatch):
    """A training function's digits run; rank 1 SIGKILLs itself after step 6 and torchrun restarts
    both ranks from the checkpoint at step 4."""
    from pipelines.models.digits import digits_pipeline, write_digits_source

    write_digits_source(platform.sources)
    monkeypatch.setenv("TRAINING_RUNTIME_FAULT_KILL_AT_STEP", "1:6")
    spec = dataclasses.replace(_short(digits_pipeline, epochs=1, checkpoint_every_steps=4),
                               train="tests.runtime.user_train:main")
    result = _train(platform, spec)
    logs = _step_logs(platform, result)
    assert not [line for line in logs if PIPES_AFTER_CLOSED in line]
    assert any("torchrun restarts the workers (restart 1 of 1)" in line for line in logs), logs[-40:]
    metrics = _metrics(platform)
    steps = {a: [r["step"] for r in metrics["reported"] if r["attempt"] == a] for a in (1, 2)}
    assert steps[1][:6] == [1, 2, 3, 4, 5, 6] and steps[2][0] == 5  # resumed after step 4's checkpoint
    assert len(metrics["reported"]) == len(steps[1]) + len(steps[2])
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "training_health"]
    assert check.severity == dg.AssetCheckSeverity.WARN  # passed too, unless a timing guard warned meanwhile
    assert check.description.startswith("recovered from 1 fault(s): attempt 1 restarted")
    assert any(line.startswith("training_health: recovered from 1 fault(s)") for line in logs)


@pytest.mark.slow
def test_a_hangs_stacks_reach_the_event_log_and_its_check_warns_naming_the_hang(platform, monkeypatch):
    from pipelines.models.digits import digits_pipeline, write_digits_source

    write_digits_source(platform.sources)
    monkeypatch.setenv("TRAINING_RUNTIME_FAULT_STOP_AT_STEP", "1:6")
    spec = _short(digits_pipeline, epochs=1, checkpoint_every_steps=4)
    spec = dataclasses.replace(spec, guards=dataclasses.replace(spec.guards, hang_timeout_s=5))
    result = _train(platform, spec)
    logs = _step_logs(platform, result)
    assert not [line for line in logs if PIPES_AFTER_CLOSED in line]
    stacks = [line for line in logs if line.startswith("hang in attempt L001-R000-")]
    assert stacks and "stacks of rank 0 when its watchdog fired" in stacks[0], logs[-40:]
    assert "Thread MainThread (most recent call last):" in stacks[0] and 'File "' in stacks[0]
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "training_health"]
    assert check.severity == dg.AssetCheckSeverity.WARN
    assert check.description.startswith("recovered from 1 fault(s): attempt 1 restarted (hang at step ")


@pytest.mark.slow
def test_a_failed_trainings_step_failure_carries_its_cause_once_without_the_launchers_error(platform):
    from pipelines.models.digits import digits_pipeline, write_digits_source

    write_digits_source(platform.sources)
    result = platform.run(_short(digits_pipeline, epochs=1, lr=1e37, checkpoint_every_steps=1))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    assert error.cause is None and error.context is None  # no "caused by: process failed with code 1"
    assert error.to_string().count("non-finite loss at step 2") == 1
    assert failure_lines(result) == [f"FAILED {failure.step_key}: {failure.step_failure_data.user_failure_data.description}"]
    logs = _step_logs(platform, result)
    assert not [line for line in logs if line.startswith("attempt ") and "non-finite" in line]
