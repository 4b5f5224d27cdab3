"""The run worker process SIGKILLed mid-training: run monitoring marks the run failed (the local
launcher checks the worker's pid), run retries start a new run, and that run resumes training
from the first run's checkpoint instead of step 0. Webserver, daemon and code server are real."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from pipelines.models.digits import write_digits_source
from resources.run_launcher import HealthCheckedRunLauncher
from tests.reliability.conftest import repeats
from tests.ui.webserver import REPO, _stop_group, running_webserver

pytestmark = pytest.mark.slow

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


@pytest.mark.parametrize("case", range(repeats(3, 1)))
def test_killed_run_worker_is_marked_failed_and_the_retry_resumes(tmp_path, ledger, case):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    write_digits_source(home / "platform" / "sources")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}, "DAGSTER_HOME": str(home),
           "PLATFORM_PROFILE": "local"}
    logs = tmp_path / "logs"
    logs.mkdir()
    with running_webserver(env, logs / "webserver.log") as url, _daemon(env, logs / "daemon.log"), \
            DagsterInstance.from_config(str(home)) as instance:
        port = int(url.rsplit(":", 1)[1])
        run_id = DagsterGraphQLClient("127.0.0.1", port_number=port).submit_job_execution("digits_training")
        launcher = HealthCheckedRunLauncher()
        launcher.register_instance(instance)
        run = lambda rid: instance.get_run_by_id(rid)  # noqa: E731
        pid = _wait(lambda: launcher.worker_pid(run(run_id)), 180, "the run worker's pid")
        ckpts = home / "platform" / "checkpoints" / "digits" / run_id / "checkpoints"
        _wait(lambda: ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir()), 300,
              "the first training checkpoint", poll_s=0.2)
        os.kill(pid, signal.SIGKILL)
        failed = _wait(lambda: run(run_id).status == DagsterRunStatus.FAILURE, 120, "the run to be marked failed")
        retry = _wait(lambda: instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run_id})), 120,
                      "the automatic retry run")[0]
        done = _wait(lambda: run(retry.run_id).status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE), 400,
                     "the retry to finish")
        status = run(retry.run_id).status
        metrics_file = home / "platform" / "checkpoints" / "digits" / run_id / "output" / "metrics.json"
        resumed = json.loads(metrics_file.read_text()).get("resumed_from_step") if metrics_file.exists() else None
    ok = bool(failed and done) and status == DagsterRunStatus.SUCCESS and bool(resumed)
    ledger.record("fault: run worker SIGKILL mid-run", ok, status == DagsterRunStatus.SUCCESS,
                  f"retry resumed from step {resumed}")
    assert status == DagsterRunStatus.SUCCESS, (logs / "daemon.log").read_text()[-3000:]
    assert resumed and resumed > 0, f"the retry started from step 0 (resumed_from_step={resumed})"
