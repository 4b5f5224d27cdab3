"""The run queue of dagster_home/dagster.yaml on a real instance: priorities, per-model and per-team
limits, and GPU units.

The real QueuedRunCoordinator daemon dequeues; runs are launched with Dagster's own
MockedRunLauncher, which records the launch without executing the run, so launched runs stay
in progress and hold their capacity while the test looks at the next dequeue.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.run_coordinator import SubmitRunContext
from dagster._core.test_utils import create_run_for_test, create_test_daemon_workspace_context, instance_for_test
from dagster._core.workspace.load_target import EmptyWorkspaceTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from core.spec import Recipe
from pipelines.automation import MODEL_TAG, PRIORITY_TAG, TEAM_TAG
from resources.gpu_pool import GPU_POOL, _claim_all, gpu_capacity, gpu_units
from pipelines.models.digits import digits_pipeline

INSTANCE_YAML = Path(__file__).resolve().parents[2] / "dagster_home" / "dagster.yaml"


@pytest.fixture
def queued_instance(tmp_path):
    config = yaml.safe_load(INSTANCE_YAML.read_text())
    config["run_launcher"] = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}
    config["concurrency"]["pools"]["default_limit"] = 4  # a cluster of 4 GPUs
    with instance_for_test(overrides=config, temp_dir=str(tmp_path)) as instance:
        with create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as workspace:
            yield instance, workspace


def _submit(instance, name: str, model: str, team: str, priority: int) -> str:
    origin = RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(
        code_location_origin=RegisteredCodeLocationOrigin("pipelines"), repository_name="__repository__"),
        job_name=f"{model}_training")
    run = create_run_for_test(instance, job_name=f"{model}_training", status=dg.DagsterRunStatus.NOT_STARTED,
                              remote_job_origin=origin,
                                       tags={MODEL_TAG: model, TEAM_TAG: team, PRIORITY_TAG: str(priority),
                                             "test/name": name})
    instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))
    return run.run_id


def _dequeue(instance, workspace) -> list[str]:
    before = {r.run_id for r in instance.run_launcher.queue()}
    list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
    return [r.tags["test/name"] for r in instance.run_launcher.queue() if r.run_id not in before]


def test_scheduled_runs_start_first_within_model_and_team_limits(queued_instance):
    instance, workspace = queued_instance
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    ids = {
        "adhoc_a": _submit(instance, "adhoc_a", "exp_a", "ml", 0),
        "adhoc_b": _submit(instance, "adhoc_b", "exp_b", "ml", 0),
        "digits_1": _submit(instance, "digits_1", "digits", "ml", 10),
        "digits_2": _submit(instance, "digits_2", "digits", "ml", 10),
        "wine": _submit(instance, "wine", "wine", "oenology", 10),
    }
    assert all(instance.get_run_by_id(i).status == dg.DagsterRunStatus.QUEUED for i in ids.values())

    # Priority 10 first in submission order; digits_2 waits for digits_1 (one run per model);
    # adhoc_b waits because team ml already has two runs (digits_1, adhoc_a).
    assert _dequeue(instance, workspace) == ["digits_1", "wine", "adhoc_a"]
    assert instance.get_run_by_id(ids["digits_2"]).status == dg.DagsterRunStatus.QUEUED
    assert _dequeue(instance, workspace) == []

    instance.report_run_canceled(instance.get_run_by_id(ids["digits_1"]))
    # digits_1 is done: the second digits run (priority 10) goes before the ad-hoc one.
    assert _dequeue(instance, workspace) == ["digits_2"]
    assert instance.get_run_by_id(ids["adhoc_b"]).status == dg.DagsterRunStatus.QUEUED

    instance.report_run_canceled(instance.get_run_by_id(ids["adhoc_a"]))
    assert _dequeue(instance, workspace) == ["adhoc_b"]


def test_max_concurrent_runs_holds_the_rest_in_the_queue(queued_instance):
    instance, workspace = queued_instance
    for i in range(6):
        _submit(instance, f"team{i}", f"model{i}", f"team{i}", 0)
    assert _dequeue(instance, workspace) == ["team0", "team1", "team2", "team3"]  # max_concurrent_runs: 4
    assert _dequeue(instance, workspace) == []


def test_gpu_units_weigh_a_training_by_its_gpu_count(queued_instance):
    instance, _ = queued_instance
    storage = instance.event_log_storage
    assert gpu_capacity(instance) == 4
    run_a, run_b, run_c = "a" * 36, "b" * 36, "c" * 36

    with gpu_units(instance, run_a, "big/checkpoint", 3):
        assert len(storage.get_concurrency_info(GPU_POOL).claimed_slots) == 3
        # 2 more do not fit in 4: all or nothing, so nothing is held while waiting.
        assert not _claim_all(storage, GPU_POOL, run_b, ["two/checkpoint[gpu0]", "two/checkpoint[gpu1]"])
        assert len(storage.get_concurrency_info(GPU_POOL).claimed_slots) == 3
        with gpu_units(instance, run_c, "one/checkpoint", 1):  # 1 more fits
            assert len(storage.get_concurrency_info(GPU_POOL).claimed_slots) == 4
    assert len(storage.get_concurrency_info(GPU_POOL).claimed_slots) == 0
    with gpu_units(instance, run_b, "two/checkpoint", 2):
        assert len(storage.get_concurrency_info(GPU_POOL).claimed_slots) == 2


def test_a_training_needing_more_gpus_than_the_cluster_has_fails_clearly(queued_instance):
    instance, _ = queued_instance
    with pytest.raises(dg.Failure, match="needs 8 GPU units but pool 'gpu' has 4"):
        with gpu_units(instance, "d" * 36, "huge/checkpoint", 8):
            pass


def test_cpu_trainings_take_no_gpu_units(queued_instance):
    instance, _ = queued_instance
    assert digits_pipeline.gpus == 0
    with gpu_units(instance, "e" * 36, "digits/checkpoint", digits_pipeline.gpus):
        assert GPU_POOL not in instance.event_log_storage.get_concurrency_keys()
    spec_gpus = Recipe(gpus_per_node=2, nnodes=2)
    assert spec_gpus.gpus_per_node * spec_gpus.nnodes == 4
