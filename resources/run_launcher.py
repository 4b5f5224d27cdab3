"""The local instance's run launcher: Dagster's default one, plus run-worker health checks.

The default launcher cannot tell that a run worker died (SIGKILL, OOM), so such a run stays
STARTED forever. This one finds the worker's pid in the run's "Started process for run" engine
event, so the daemon's run monitoring marks the run failed and run retries start a new run,
which resumes training from the first run's checkpoints (they are keyed by the root run id).
"""

from __future__ import annotations

import psutil
from dagster import DagsterEventType, DagsterRun
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus


class HealthCheckedRunLauncher(DefaultRunLauncher):
    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def worker_pid(self, run: DagsterRun) -> int | None:
        records = self._instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=50).records
        for record in records:
            event = record.event_log_entry.dagster_event
            if event is None or event.event_specific_data is None:
                continue
            meta = getattr(event.event_specific_data, "metadata", None) or {}
            if "pid" in meta and "Started process for run" in (record.event_log_entry.message or ""):
                return int(meta["pid"].value)
        return None

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        pid = self.worker_pid(run)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "the run worker has not reported its pid yet")
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        if alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process {pid} is gone (killed or crashed)")
