"""Many runs submitted at once through the webserver, the queue allowing 2 at a time and a GPU pool
of 2 units: all finish, are started in priority order, and never exceed either capacity."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from tests.reliability.conftest import repeats
from tests.ui.webserver import REPO, _stop_group, running_webserver

# make reliability runs it (all its cases); make test leaves it out to stay inside its 25 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

INSTANCE_YAML = """
telemetry:
  enabled: false
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
concurrency:
  runs:
    max_concurrent_runs: 2
  pools:
    default_limit: 2
"""


def _max_overlap(intervals: list[tuple[float, float, int]]) -> int:
    """Largest sum of weights held at one instant."""
    events = sorted([(s, w) for s, _, w in intervals] + [(e, -w) for _, e, w in intervals], key=lambda x: (x[0], x[1]))
    held = peak = 0
    for _, w in events:
        held += w
        peak = max(peak, held)
    return peak


def test_a_burst_of_runs_respects_priorities_and_capacity(tmp_path, ledger):
    n_runs = repeats(30, 6)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests/reliability/queue_location.py'}\n"
        f"      working_directory: {REPO}\n      location_name: queue\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}, "DAGSTER_HOME": str(home),
           "PYTHONPATH": str(REPO)}
    rng = random.Random(7)
    plan = [(rng.choice([0, 5, 10]), rng.choice([1, 1, 2])) for _ in range(n_runs)]  # (priority, GPU units)
    run_ids: list[str] = []
    with running_webserver(env, tmp_path / "webserver.log", workspace=tmp_path / "workspace.yaml") as url:
        client = DagsterGraphQLClient("127.0.0.1", port_number=int(url.rsplit(":", 1)[1]))
        for priority, units in plan:
            run_ids.append(client.submit_job_execution(
                "gpu_queue_job", tags={"dagster/priority": str(priority)},
                run_config={"ops": {"gpu_work": {"config": {"units": units, "seconds": 6.0,
                                                            "record_dir": str(records)}}}}))
        # Every run is queued before the daemon starts, so the dequeue order is the queue's alone.
        with (tmp_path / "daemon.log").open("w") as log:
            daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w",
                                       str(tmp_path / "workspace.yaml")], cwd=REPO, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with DagsterInstance.from_config(str(home)) as instance:
                deadline = time.monotonic() + 60 * n_runs
                while time.monotonic() < deadline:
                    runs = instance.get_runs(RunsFilter(run_ids=run_ids))
                    if all(r.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE) for r in runs):
                        break
                    time.sleep(2)
                records_by_id = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=run_ids))}
        finally:
            _stop_group(daemon)
    statuses = [records_by_id[r].dagster_run.status for r in run_ids]
    all_done = all(s == DagsterRunStatus.SUCCESS for s in statuses)
    priority_of = dict(zip(run_ids, (p for p, _ in plan)))
    started = sorted(run_ids, key=lambda r: records_by_id[r].start_time or float("inf"))
    priorities_in_start_order = [priority_of[r] for r in started]
    in_order = priorities_in_start_order == sorted(priorities_in_start_order, reverse=True)
    held = [json.loads(p.read_text()) for p in records.iterdir()]
    gpu_peak = _max_overlap([(h["start"], h["end"], h["units"]) for h in held])
    run_peak = _max_overlap([(records_by_id[r].start_time, records_by_id[r].end_time, 1) for r in run_ids
                             if records_by_id[r].start_time and records_by_id[r].end_time])
    # The daemon launches a run every ~3 s and each holds its slot for 6 s: the queue's limit of 2
    # must be reached (else the test proves nothing about it) and never exceeded.
    ok = all_done and in_order and gpu_peak <= 2 and run_peak == 2
    ledger.record("load: burst of queued runs", ok, all_done and len(held) == n_runs,
                  f"{n_runs} runs, priorities 0/5/10, 1-2 GPU units each; peak {run_peak} runs, {gpu_peak} GPU units")
    assert all_done, [str(s) for s in statuses]
    assert in_order, priorities_in_start_order
    assert gpu_peak <= 2 and run_peak == 2, (gpu_peak, run_peak)
