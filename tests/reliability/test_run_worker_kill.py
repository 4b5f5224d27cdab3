"""The run worker process SIGKILLed mid-training: run monitoring marks the run failed (the local
launcher checks the worker's pid), run retries start a new run, and that run resumes training
from the first run's checkpoint instead of step 0. Webserver, daemon and code server are real."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from pipelines.models.digits import write_digits_source
from resources.run_launcher import HealthCheckedRunLauncher
from tests.reliability.conftest import repeats
from tests.ui.webserver import REPO, _stop_group, running_webserver

# make reliability runs it (all its cases); make test leaves it out to stay inside its 25 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

INSTANCE_YAML = """
telemetry:
  enabled: false
run_launcher:
  module: resources.run_launcher
  class: HealthCheckedRunLauncher
run_monitoring:
  enabled: true
  poll_interval_seconds: 2
  start_timeout_seconds: 180
  max_resume_run_attempts: 0
run_retries:
  enabled: true
  max_retries: 1
"""


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextlib.contextmanager
def _daemon(env: dict[str, str], log_path: Path):
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        _stop_group(proc)


@dataclass
class _Deployment:
    home: Path
    logs: Path
    instance: DagsterInstance
    client: DagsterGraphQLClient
    launcher: HealthCheckedRunLauncher


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """One instance with a real webserver and daemon; each case submits its own run to it."""
    tmp = tmp_path_factory.mktemp("run-worker-kill")
    home = tmp / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    write_digits_source(home / "platform" / "sources")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}, "DAGSTER_HOME": str(home),
           "PLATFORM_PROFILE": "local"}
    logs = tmp / "logs"
    logs.mkdir()
    with running_webserver(env, logs / "webserver.log") as url, _daemon(env, logs / "daemon.log"), \
            DagsterInstance.from_config(str(home)) as instance:
        launcher = HealthCheckedRunLauncher()
        launcher.register_instance(instance)
        client = DagsterGraphQLClient("127.0.0.1", port_number=int(url.rsplit(":", 1)[1]))
        yield _Deployment(home, logs, instance, client, launcher)


def _newest_checkpoint_step(ckpts: Path) -> int:
    """Older checkpoints are pruned (keep_last), so count by step number, not by directories."""
    steps = [int(p.name.removeprefix("step_")) for p in ckpts.iterdir() if p.name.startswith("step_")] \
        if ckpts.is_dir() else []
    return max(steps, default=0)


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_killed_run_worker_is_marked_failed_and_the_retry_resumes(deployment, ledger, case):
    rng = random.Random(case)
    # A random point: after the k-th checkpoint (of 9 in the run), then up to ~30 steps more.
    after_checkpoints, extra_s = rng.randint(1, 5), rng.uniform(0.0, 0.3)  # 352 steps take ~3 s
    d = deployment
    run_id = d.client.submit_job_execution("digits_training")
    run = lambda rid: d.instance.get_run_by_id(rid)  # noqa: E731
    pid = _wait(lambda: d.launcher.worker_pid(run(run_id)), 180, "the run worker's pid")
    ckpts = d.home / "platform" / "checkpoints" / "digits" / run_id / "checkpoints"
    _wait(lambda: _newest_checkpoint_step(ckpts) >= 40 * after_checkpoints, 300, f"training checkpoint {after_checkpoints}",
          poll_s=0.1)
    time.sleep(extra_s)
    assert run(run_id).status == DagsterRunStatus.STARTED, "the run ended before the kill: nothing was tested"
    os.kill(pid, signal.SIGKILL)
    failed = _wait(lambda: run(run_id).status == DagsterRunStatus.FAILURE, 120, "the run to be marked failed")
    retry = _wait(lambda: d.instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run_id})), 120,
                  "the automatic retry run")[0]
    done = _wait(lambda: run(retry.run_id).status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE), 400,
                 "the retry to finish")
    status = run(retry.run_id).status
    metrics_file = d.home / "platform" / "checkpoints" / "digits" / run_id / "output" / "metrics.json"
    resumed = json.loads(metrics_file.read_text()).get("resumed_from_step") if metrics_file.exists() else None
    # Checkpoints are published by an atomic rename, so the k-th one seen is complete.
    ok = bool(failed and done) and status == DagsterRunStatus.SUCCESS and (resumed or 0) >= 40 * after_checkpoints
    ledger.record("fault: run worker SIGKILL mid-run", ok, status == DagsterRunStatus.SUCCESS,
                  "killed after a random checkpoint (1-5 of 9); the retry resumed from it")
    assert status == DagsterRunStatus.SUCCESS, (d.logs / "daemon.log").read_text()[-3000:]
    assert (resumed or 0) >= 40 * after_checkpoints, (
        f"the retry resumed from step {resumed}, before checkpoint {after_checkpoints} that existed at the kill")
