"""Issue 45 as a user meets it: a wine sweep of 6 trials, 2 at a time, on a real instance (webserver,
daemon, code server, the shipped dagster.yaml's run monitoring and run retries). The run worker is
SIGKILLed once two trials finished and a pruned one has stopped and written its outputs, before the
sweep told the study; the automatic retry finishes the sweep and registers its best trial.

Checked: the pruned trial is never launched again and stays pruned (its metrics.json untouched,
``sweeps`` counts it); every validation rank 0 wrote is in one of the two runs' event logs; every
trial's worker logs have a folder of their own, linked from the lineage; the trial cut off
mid-training counts two launches; the killed run and the retry say that the run worker died and
that the retry resumes the sweep."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from ops.sweep import study_name, sweep_storage_url
from resources.run_launcher import HealthCheckedRunLauncher
from tests.ui.webserver import REPO, _stop_group, running_webserver

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

WORKSPACE = """load_from:
  - python_module:
      module_name: tests.experiments.sweep_kill_location
      working_directory: {repo}
      location_name: platform
"""
VALIDATION_LINE = re.compile(r"^validation at step (\d+): loss (-?[\d.]+) ")


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextlib.contextmanager
def _daemon(env: dict[str, str], workspace: Path, log_path: Path):
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(workspace)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        _stop_group(proc)


def _shipped_instance_yaml() -> str:
    """The shipped dagster.yaml (run monitoring, run retries), polling every 2 s instead of 10."""
    text = (REPO / "dagster_home" / "dagster.yaml").read_text()
    assert "poll_interval_seconds: 10" in text and "max_retries: 1" in text
    return text.replace("poll_interval_seconds: 10", "poll_interval_seconds: 2")


def _metrics(trials: Path) -> dict[int, dict]:
    out = {}
    for folder in sorted(trials.glob("trial-*")):
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            out[int(folder.name.removeprefix("trial-"))] = json.loads((folder / "output" / "metrics.json").read_text())
    return out


def _validation_lines(instance: DagsterInstance, run_ids: list[str]) -> Counter:
    found = Counter()
    for run_id in run_ids:
        for entry in instance.all_logs(run_id):
            if m := VALIDATION_LINE.match(entry.message or ""):
                found[(int(m.group(1)), m.group(2))] += 1
    return found


def _messages(instance: DagsterInstance, run_id: str) -> list[str]:
    return [e.message or "" for e in instance.all_logs(run_id)]


def test_a_sweep_whose_run_worker_is_killed_resumes_with_every_trial_as_it_ended(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(_shipped_instance_yaml())
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(WORKSPACE.format(repo=REPO))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}, "DAGSTER_HOME": str(home),
           "PLATFORM_PROFILE": "local"}
    logs = tmp_path / "logs"
    with running_webserver(env, logs / "webserver.log", workspace=workspace) as url, \
            _daemon(env, workspace, logs / "daemon.log"), DagsterInstance.from_config(str(home)) as instance:
        launcher = HealthCheckedRunLauncher()
        launcher.register_instance(instance)
        client = DagsterGraphQLClient("127.0.0.1", port_number=int(url.rsplit(":", 1)[1]))
        run_id = client.submit_job_execution("wine_training")
        run = lambda rid: instance.get_run_by_id(rid)  # noqa: E731
        pid = _wait(lambda: launcher.worker_pid(run(run_id)), 240, "the run worker's pid")
        trials = home / "platform" / "checkpoints" / "wine" / run_id / "trials"

        def pruned_and_two_complete():
            metrics = _metrics(trials)
            pruned = [n for n, m in metrics.items() if m.get("pruned")]
            return pruned if pruned and sum(not m.get("pruned") for m in metrics.values()) >= 2 else None

        (pruned, *_) = _wait(pruned_and_two_complete, 600, "two complete trials and a pruned one", poll_s=0.02)
        os.kill(pid, signal.SIGKILL)  # the run worker: its trials' supervisors end their trainings
        storage = sweep_storage_url(instance)
        name = study_name("wine", run_id)
        at_kill = {t.number: t.state for t in optuna.load_study(study_name=name, storage=storage).trials}
        assert at_kill[pruned] == optuna.trial.TrialState.RUNNING, (
            f"trial {pruned} was told before the kill ({at_kill[pruned]}): the kill came too late to test the case")
        cut_off = [n for n, s in at_kill.items() if s == optuna.trial.TrialState.RUNNING and n != pruned]
        pruned_bytes = (trials / f"trial-{pruned:03d}" / "output" / "metrics.json").read_bytes()

        _wait(lambda: run(run_id).status == DagsterRunStatus.FAILURE, 180, "the killed run to be marked failed")
        retry = _wait(lambda: instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run_id})), 180,
                      "the automatic retry run")[0].run_id
        _wait(lambda: run(retry).status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE), 900,
              "the retry to finish", poll_s=2)
        assert run(retry).status == DagsterRunStatus.SUCCESS, "\n".join(_messages(instance, retry)[-40:])

        study = optuna.load_study(study_name=name, storage=storage)
        states = {t.number: t.state for t in study.trials}
        retry_log, killed_log = _messages(instance, retry), _messages(instance, run_id)

        # 1. The pruned trial is read from what it wrote: pruned, not launched again, its record kept.
        assert states[pruned] == optuna.trial.TrialState.PRUNED
        assert (trials / f"trial-{pruned:03d}" / "output" / "metrics.json").read_bytes() == pruned_bytes
        assert not any(f"(trial {pruned})" in m and m.startswith("Launching") for m in retry_log)
        listed = subprocess.run([sys.executable, "-m", "pipelines", "sweeps", "wine", "--json"], cwd=REPO, env=env,
                                capture_output=True, text=True, check=True)
        (sweep_json,) = json.loads(listed.stdout)
        by_number = {t["number"]: t for t in sweep_json["trials"]}
        assert by_number[pruned]["state"] == "pruned" and by_number[pruned]["attempts"] == 1
        text = subprocess.run([sys.executable, "-m", "pipelines", "sweeps", "wine"], cwd=REPO, env=env,
                              capture_output=True, text=True, check=True).stdout
        pruned_count = sum(s == optuna.trial.TrialState.PRUNED for s in states.values())
        assert f"{pruned_count} pruned" in text.splitlines()[0] and pruned_count >= 1
        print(text)  # the docs show this output

        # 2. Every validation rank 0 wrote (each trial's report file) is in one of the two event logs.
        written = Counter()
        for folder in trials.glob("trial-*"):
            for line in (folder / "validations.jsonl").read_text().splitlines():
                record = json.loads(line)
                written[(record["step"], f"{record['loss']:.4f}")] += 1
        logged = _validation_lines(instance, [run_id, retry])
        missing = written - logged
        assert not missing, f"{sum(missing.values())} of {sum(written.values())} validations in neither run's log"

        # 3. One log folder per trial, each linked from the lineage; none shared.
        from core.registry import read_lineage
        from pipelines.profiles import Profile

        monkeypatch.setenv("DAGSTER_HOME", str(home))
        monkeypatch.setenv("PLATFORM_PROFILE", "local")
        record = read_lineage(Profile.from_environment().store(), "wine")
        uris = {r["number"]: r["logs_uri"] for r in record["sweep"]["records"]}
        assert len(uris) == 6 and len(set(uris.values())) == 6, uris
        artifacts = home / "platform" / "artifacts"
        for number, uri in uris.items():
            assert uri.rstrip("/").endswith(f"/trial-{number:03d}"), uri
            folder = artifacts / uri.split("/artifacts/", 1)[1]
            assert list(folder.glob("launch_*/attempt_*/rank_0.stderr.log")), f"trial {number}: no rank log in {folder}"

        # 4. Launches counted over both runs, and the lineage says the version came from a resumed sweep.
        for n in cut_off:
            assert by_number[n]["attempts"] == 2 and by_number[n]["resumed"], by_number[n]
            assert by_number[n]["runs"] == [run_id, retry]
        resumed = [r for r in record["sweep"]["runs"] if r["run_id"] == retry]
        assert resumed and resumed[0]["parent_run_id"] == run_id and pruned in resumed[0]["cut_off_trials"]

        # 5. Both runs say that the run worker died and that the retry resumes the sweep.
        assert any("ended when its run worker died" in m and "resumes the sweep" in m for m in retry_log), retry_log
        assert any(m.startswith("The run worker died") and retry in m for m in killed_log)
