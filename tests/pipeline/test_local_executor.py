"""The local profile's executor: in process unless a run asks for processes (issue 41, item 4:
sharding spread over workers locally through the multiprocess executor).

A table's groups of parts are steps (assets/table_shard_steps.py). Run with
``execution: {config: {multiprocess: {max_concurrent: 2}}}`` each step runs in a process of its
own, and the version is byte for byte the one the in-process default makes."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from pipelines.profiles import LOCAL_EXECUTOR, Profile
from tests.pipeline.conftest import Platform
from tests.pipeline.test_table_shard_steps import (
    DATA_ROOT_VAR,
    _frame,
    _published_equals_a_single_step_build,
    _spec,
    _write,
    steps_job,
)

pytestmark = pytest.mark.slow


def test_the_local_executor_runs_in_process_unless_a_run_asks_for_processes():
    assert Profile(name="local", data_root=Path("/nowhere")).executor() is LOCAL_EXECUTOR
    assert LOCAL_EXECUTOR.config_schema.default_value == {"in_process": {}}


def _step_pids(result) -> dict[str, int]:
    return {e.step_key: e.pid for e in result.all_events if e.is_step_start}


def test_a_tables_groups_run_in_processes_of_their_own_when_the_run_asks_and_the_version_is_the_same(
        tmp_path, monkeypatch):
    platform = Platform(tmp_path)
    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    _write(platform.sources, "ledger/table.csv", _frame(np.random.default_rng(1).permutation(500)))
    job = dg.reconstructable(steps_job)
    config = {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}}
    with platform.instance:
        with dg.execute_job(job, instance=platform.instance, run_config=config, raise_on_error=False) as result:
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            pids = _step_pids(result)
    groups = {k: pid for k, pid in pids.items() if "_shard_parts[" in k}
    assert len(groups) >= 3
    assert len(set(pids.values())) == len(pids)  # every step in a process of its own
    _published_equals_a_single_step_build(platform.store(), _spec("ledger", "ledger/table.csv"), tmp_path / "check")
