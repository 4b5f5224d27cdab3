"""Every pod's log is gathered before the Job is deleted (success, failure, timeout), against the
local stand-in for the API server: its pods are real processes and a deleted Job's logs are gone
(404), so a kept log is one that was read in time. The full launches (a real training that fails,
a two-pod one that succeeds) are in test_pod_simulation.py."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from resources.k8s.client import TrainingJobClient
from resources.k8s.launcher import pod_log_keeper, pod_log_root
from resources.k8s.manifests import POD_INDEX_ENV, PodSettings, TRAINER_CONTAINER, build_manifests
from tests.k8s.helpers import make_job, validate_all
from tests.k8s.local_cluster import LocalCluster


class _Log:
    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))


class _Context:
    def __init__(self):
        self.log = _Log()


def _manifests(settings: PodSettings, *, nnodes: int, script: str) -> list[dict]:
    """The launcher's own manifests, each pod running a short Python script instead of torchrun
    (the manifest's env gives it its completion index)."""
    manifests = build_manifests(make_job(nnodes=nnodes, nproc=1, gpus=0), settings)
    validate_all(manifests)
    (container,) = manifests[0]["spec"]["template"]["spec"]["containers"]
    container["command"] = [Path(sys.executable).name, "-c", script]
    return manifests


def _wait_exited(cluster: LocalCluster) -> None:
    deadline = time.monotonic() + 60
    while any(p.phase in ("Pending", "Running") for j in cluster.jobs.values() for p in j.pods):
        assert time.monotonic() < deadline, "pods did not exit"
        time.sleep(0.05)


SAYS_INDEX = f"import os; print('pod', os.environ['{POD_INDEX_ENV}'], 'says hi', flush=True)"
FAILS_ON_POD_1 = SAYS_INDEX + f"; raise SystemExit(3 if os.environ['{POD_INDEX_ENV}'] == '1' else 0)"


@pytest.fixture
def settings(tmp_path, settings: PodSettings) -> PodSettings:
    """The shared settings, the shared volume under tmp_path; secrets the pods can resolve."""
    return dataclasses.replace(settings, shared_mount_path=str(tmp_path / "shared"))


SECRETS = {"model-factory-s3": {"AWS_ACCESS_KEY_ID": "AKIALOCALTEST", "AWS_SECRET_ACCESS_KEY": "local-secret"}}


@pytest.fixture
def cluster(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS)
    (tmp_path / "cluster").mkdir()
    yield cluster
    cluster.close()


def test_every_pods_log_is_kept_before_a_failed_job_is_deleted(tmp_path, settings, cluster):
    job = make_job(nnodes=2, nproc=1, gpus=0)
    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.05)
    context = _Context()
    root = pod_log_root(job, settings)
    with pytest.raises(RuntimeError, match="failed"):
        with client.launched(_manifests(settings, nnodes=2, script=FAILS_ON_POD_1),
                             before_delete=pod_log_keeper(context, client, settings.namespace, root)) as name:
            _wait_exited(cluster)
            pods = sorted(p.name for p in cluster.jobs[name].pods)
            client.wait_finished(name, settings.namespace)  # raises TrainingJobFailed
    assert cluster.calls[-1] == f"delete Job {job.name}" and not cluster.jobs
    # Read before the deletion: the pods (and their logs) are gone now.
    for pod in pods:
        with pytest.raises(ApiException) as gone:
            cluster.core.read_namespaced_pod_log(pod, settings.namespace, _preload_content=False)
        assert gone.value.status == 404
    assert root == tmp_path / "shared" / "launches" / job.name / "logs"
    kept = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.log"))
    assert kept == [f"launch_0/{pod}/{TRAINER_CONTAINER}.log" for pod in pods]
    for index, pod in enumerate(pods):
        text = (root / "launch_0" / pod / f"{TRAINER_CONTAINER}.log").read_text()
        # Timestamped as `kubectl logs --timestamps`; each pod's own output, the failed one's too.
        assert text.endswith(f" pod {index} says hi\n") and text[:4].isdigit()
    assert ("info", f"kept 2 container log(s) of Job {settings.namespace}/{job.name} in {root / 'launch_0'}") \
        in context.log.lines


def test_a_restarted_container_keeps_its_previous_runs_log_and_pending_pods_have_none(settings, cluster):
    client = TrainingJobClient(cluster.batch, cluster.core)
    manifests = _manifests(settings, nnodes=1, script=SAYS_INDEX)
    cluster.batch.create_namespaced_job(settings.namespace, manifests[0])
    _wait_exited(cluster)
    (pod,) = cluster.jobs[manifests[0]["metadata"]["name"]].pods
    pod.previous_log = b"2026-01-01T00:00:00.000000Z CUDA error: an illegal memory access\n"
    logs = client.container_logs(manifests[0]["metadata"]["name"], settings.namespace)
    assert sorted(logs) == [f"{pod.name}/{TRAINER_CONTAINER}.log", f"{pod.name}/{TRAINER_CONTAINER}.previous.log"]
    assert logs[f"{pod.name}/{TRAINER_CONTAINER}.previous.log"].endswith(b"illegal memory access\n")
    assert logs[f"{pod.name}/{TRAINER_CONTAINER}.log"].endswith(b" pod 0 says hi\n")

    unscheduled = LocalCluster(cluster.workdir, secrets=SECRETS, schedulable=False)
    unscheduled.batch.create_namespaced_job(settings.namespace, _manifests(settings, nnodes=1, script=SAYS_INDEX)[0])
    idle = TrainingJobClient(unscheduled.batch, unscheduled.core)
    assert idle.container_logs(manifests[0]["metadata"]["name"], settings.namespace) == {}


def test_the_job_is_deleted_even_when_keeping_its_logs_fails(tmp_path, settings, cluster):
    client = TrainingJobClient(cluster.batch, cluster.core)

    def broken(name: str) -> None:
        raise OSError("the shared volume is full")

    with pytest.raises(OSError, match="full"):
        with client.launched(_manifests(settings, nnodes=1, script=SAYS_INDEX), before_delete=broken):
            pass
    assert not cluster.jobs and cluster.calls[-1].startswith("delete Job")

    # The launcher's keeper turns such a failure into a warning, so the launch's own outcome stands.
    context = _Context()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the log folder should be")
    with client.launched(_manifests(settings, nnodes=1, script=SAYS_INDEX),
                         before_delete=pod_log_keeper(context, client, settings.namespace, blocked)):
        _wait_exited(cluster)
    assert not cluster.jobs
    ((level, message),) = context.log.lines
    assert level == "warning" and message.startswith("could not keep the pod logs of Job")
