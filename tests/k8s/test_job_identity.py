"""One Job per training, even across retries.

The Job name comes from the root run, the asset and the checkpoint directory
(ops/training_config.py), so a retried step finds its earlier attempt's Job; the client deletes it
(foreground) and waits until its pods are gone before it creates its own
(TrainingJobClient.replace_previous). A fake API server whose deletions take time, as a real one's
do (pods terminate over their grace period), records every moment two Jobs' pods would run on one
checkpoint directory.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pytest
from kubernetes.client import V1Job, V1JobStatus, V1ObjectMeta, V1Pod, V1PodList, V1PodStatus
from kubernetes.client.exceptions import ApiException

from core.spec import PipelineSpec, Recipe, Source
from ops.runs import root_run_id
from ops.training_config import training_job
from resources.k8s.client import TrainingJobClient
from resources.k8s.launcher import run_training_job
from resources.k8s.manifests import JOB_LABEL, PodSettings, build_manifests, config_json, config_path
from tests.k8s.local_cluster import LocalCluster
from tests.k8s.test_pod_simulation import CPU_NODES, SECRETS, _setup

FIRST_RUN = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
RETRY_RUN = "9a8b7c6d-aaaa-bbbb-cccc-000000000002"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _spec(name: str = "toy") -> PipelineSpec:
    return PipelineSpec(name=name, source=Source(paths=("x.csv",)), feature_columns=("a", "b"), label_column="y",
                        class_names=("0", "1"), recipe=Recipe())


def _context(run_id: str, root: str | None = None) -> SimpleNamespace:
    """What root_run_id reads of a Dagster context: a retry carries its chain's root as a tag."""
    return SimpleNamespace(run_id=run_id, run=SimpleNamespace(tags={"dagster/root_run_id": root} if root else {}))


def _config(root: Path, spec_name: str, root_run: str) -> dict:
    # As ops/training.py lays it out: checkpoints under <asset>/<root run>.
    work = root / spec_name / root_run
    return {"output_dir": str(work / "output"), "checkpoint": {"dir": str(work / "checkpoints")}}


def test_a_retry_names_the_same_job_and_another_run_another(tmp_path):
    spec = _spec()
    first, retry = _context(FIRST_RUN), _context(RETRY_RUN, root=FIRST_RUN)
    names = [training_job(spec, root_run_id(c), _config(tmp_path, spec.name, root_run_id(c))).name
             for c in (first, retry)]
    assert names[0] == names[1]
    other = _context(RETRY_RUN)  # a new run, not a retry: its own checkpoints, its own Job
    assert training_job(spec, root_run_id(other), _config(tmp_path, spec.name, RETRY_RUN)).name != names[0]


def test_job_names_are_dns_labels_that_keep_the_run_apart_for_long_asset_names(tmp_path):
    spec = _spec("p" + "_x" * 31)  # 63 characters, the longest a pipeline name may be
    a = training_job(spec, FIRST_RUN, _config(tmp_path, spec.name, FIRST_RUN)).name
    b = training_job(spec, RETRY_RUN, _config(tmp_path, spec.name, RETRY_RUN)).name
    assert a != b
    for name in (a, b):
        assert len(name) <= 63 and DNS_LABEL.match(name), name


def test_trainings_of_one_run_in_different_checkpoint_directories_get_different_jobs(tmp_path):
    spec = _spec()
    config = _config(tmp_path, spec.name, FIRST_RUN)
    trial = {**config, "checkpoint": {"dir": config["checkpoint"]["dir"] + "/trial-1"}}
    assert training_job(spec, FIRST_RUN, config).name != training_job(spec, FIRST_RUN, trial).name


# --- a fake API server with deletions that take time ------------------------------------------------
@dataclass
class FakePod:
    name: str
    job: str
    checkpoint_dir: str
    grace_polls: int | None = None  # None: running; else API reads left until it is gone


@dataclass
class FakeApi:
    """BatchV1Api and CoreV1Api in one, for the calls TrainingJobClient makes. Time passes one tick
    per read; a terminating pod is gone after `grace` ticks; a Job deleted in the foreground goes
    after its pods, one deleted in the background at once (its pods terminate afterwards)."""

    grace: int | None = 3  # None: pods never finish terminating (a stuck node)
    jobs: dict[str, str] = field(default_factory=dict)  # name -> checkpoint dir
    deleting: set[str] = field(default_factory=set)
    pods: list[FakePod] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def _tick(self) -> None:
        for pod in list(self.pods):
            if pod.grace_polls is not None:
                pod.grace_polls -= 1
                if pod.grace_polls <= 0:
                    self.pods.remove(pod)
                    self.events.append(f"pod {pod.name} gone")
        for name in list(self.deleting):
            if not any(p.job == name for p in self.pods):
                self.deleting.discard(name)
                del self.jobs[name]
                self.events.append(f"Job {name} gone")

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> V1Job:
        name = body["metadata"]["name"]
        if name in self.jobs:
            raise ApiException(status=409, reason="AlreadyExists")
        command = body["spec"]["template"]["spec"]["containers"][0]["command"]
        config = json.loads(Path(command[command.index("--config") + 1]).read_text())
        ckpt = config["checkpoint"]["dir"]
        alive = [p.name for p in self.pods if p.checkpoint_dir == ckpt]
        if alive:
            self.violations.append(f"Job {name} created while {alive} still run on {ckpt}")
        self.jobs[name] = ckpt
        self.pods += [FakePod(f"{name}-{i}-x", name, ckpt) for i in range(body["spec"]["completions"])]
        self.events.append(f"create Job {name}")
        return V1Job(metadata=V1ObjectMeta(name=name, uid=f"uid-{len(self.events)}"))

    def read_namespaced_job_status(self, name: str, namespace: str) -> V1Job:
        self._tick()
        if name not in self.jobs:
            raise ApiException(status=404, reason="Not Found")
        return V1Job(metadata=V1ObjectMeta(name=name), status=V1JobStatus(active=1))

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str | None = None) -> None:
        if name not in self.jobs or name in self.deleting:
            raise ApiException(status=404, reason="Not Found")
        self.events.append(f"delete Job {name} ({propagation_policy})")
        for pod in self.pods:
            if pod.job == name and pod.grace_polls is None:
                pod.grace_polls = self.grace if self.grace is not None else 10**9
        if propagation_policy == "Foreground":
            self.deleting.add(name)
        else:
            del self.jobs[name]

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        raise ApiException(status=404, reason="Not Found")

    def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> None:
        pass

    def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> V1PodList:
        self._tick()
        job = label_selector.removeprefix(f"{JOB_LABEL}=")
        return V1PodList(items=[V1Pod(metadata=V1ObjectMeta(name=p.name), status=V1PodStatus(phase="Running"))
                                for p in self.pods if p.job == job])


def _client(api: FakeApi, **kwargs: Any) -> TrainingJobClient:
    now = [0.0]
    return TrainingJobClient(api, api, poll_interval_s=1.0, clock=lambda: now[0],
                             sleep=lambda s: now.__setitem__(0, now[0] + s), **kwargs)


def _launch_manifests(tmp_path: Path, root_run: str, *, nnodes: int = 2) -> tuple[list[dict], PodSettings]:
    """A training's manifests, its config written where the pods read it (as run_training_job does)."""
    from resources.launch.base import GpuRequest

    spec = _spec()
    settings = PodSettings(namespace="model-factory", image="img:1", shared_mount_path=str(tmp_path))
    job = training_job(spec, root_run, _config(tmp_path, spec.name, FIRST_RUN))
    job = type(job)(name=job.name, config=job.config, nproc_per_node=1, nnodes=nnodes,
                    gpu=GpuRequest(nodes=nnodes, gpus_per_node=0))
    path = Path(config_path(job, settings))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_json(job.config))
    return build_manifests(job, settings), settings


def test_a_retry_replaces_the_earlier_attempts_job_only_after_its_pods_are_gone(tmp_path):
    api = FakeApi(grace=3)
    manifests, settings = _launch_manifests(tmp_path, FIRST_RUN)
    name = manifests[0]["metadata"]["name"]
    # Attempt 1: its step pod was killed, so its `finally` never deleted the Job.
    api.create_namespaced_job(settings.namespace, manifests[0])
    # Attempt 2 (a retry: same root run, same name).
    client = _client(api)
    said: list[str] = []
    assert client.replace_previous(name, settings.namespace, say=said.append)
    with client.launched(manifests) as launched:
        assert launched == name
    assert api.violations == []
    assert api.events[:6] == [f"create Job {name}", f"delete Job {name} (Foreground)", f"pod {name}-0-x gone",
                              f"pod {name}-1-x gone", f"Job {name} gone", f"create Job {name}"]
    assert "earlier attempt" in said[0]


def test_pods_of_a_job_already_deleted_in_the_background_are_waited_out(tmp_path):
    api = FakeApi(grace=4)
    manifests, settings = _launch_manifests(tmp_path, FIRST_RUN)
    name = manifests[0]["metadata"]["name"]
    api.create_namespaced_job(settings.namespace, manifests[0])
    # The earlier attempt's own `finally` deleted it (background): the Job is gone, its pods are not.
    api.delete_namespaced_job(name, settings.namespace, propagation_policy="Background")
    client = _client(api)
    assert client.replace_previous(name, settings.namespace)
    with client.launched(manifests):
        pass
    assert api.violations == []


def test_nothing_to_replace_on_a_first_attempt(tmp_path):
    api = FakeApi()
    manifests, settings = _launch_manifests(tmp_path, FIRST_RUN)
    assert not _client(api).replace_previous(manifests[0]["metadata"]["name"], settings.namespace)
    assert api.events == []


def test_the_fake_sees_two_jobs_on_one_checkpoint_directory(tmp_path):
    """Without replacement (names per run, as before), the second Job would start beside the first:
    the fake records it, so the tests above would fail on a launcher that does not replace."""
    api = FakeApi()
    manifests, settings = _launch_manifests(tmp_path, FIRST_RUN)
    api.create_namespaced_job(settings.namespace, manifests[0])
    other = json.loads(json.dumps(manifests[0]))
    other["metadata"]["name"] = "toy-per-run-name"
    api.create_namespaced_job(settings.namespace, other)
    assert len(api.violations) == 1 and "still run on" in api.violations[0]


def test_a_job_created_concurrently_by_another_attempt_fails_the_launch(tmp_path):
    api = FakeApi()
    manifests, settings = _launch_manifests(tmp_path, FIRST_RUN)
    api.create_namespaced_job(settings.namespace, manifests[0])  # after our replace_previous, say
    with pytest.raises(RuntimeError, match="another attempt of this training started"):
        with _client(api).launched(manifests):
            pass
    assert api.violations == []


def test_a_deletion_that_never_finishes_fails_with_the_fix(tmp_path):
    api = FakeApi(grace=None)
    manifests, settings = _launch_manifests(tmp_path, FIRST_RUN)
    name = manifests[0]["metadata"]["name"]
    api.create_namespaced_job(settings.namespace, manifests[0])
    with pytest.raises(TimeoutError, match=rf"kubectl -n model-factory describe job {name}"):
        _client(api, deletion_timeout_s=30).replace_previous(name, settings.namespace)
    assert not any(e.startswith("create") for e in api.events[1:])


@pytest.mark.slow
def test_the_launcher_replaces_an_orphaned_job_before_writing_its_config(tmp_path):
    """Through run_training_job and the local cluster: the earlier attempt's pod (here a sleeper,
    standing in for a training) is stopped and its Job deleted before this attempt's config is
    written and its Job created. This attempt's config fails at once (a bad optimizer), enough to
    show the order without training."""
    settings, job = _setup(tmp_path, nnodes=1)
    job.config["train"]["optimizer"] = "no-such-optimizer"
    (tmp_path / "cluster").mkdir()
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=CPU_NODES)
    orphan = build_manifests(job, settings)[0]
    orphan["spec"]["template"]["spec"]["containers"][0]["command"] = [
        Path(sys.executable).name, "-c", "import time; time.sleep(600)"]
    cluster.batch.create_namespaced_job(settings.namespace, orphan)
    (sleeper,) = [p.proc for p in cluster.jobs[job.name].pods]
    config_file = Path(config_path(job, settings))
    written_while_orphan_ran: list[bool] = []
    real_write = Path.write_text

    def watch_write(self, *args, **kwargs):
        if self == config_file:
            written_while_orphan_ran.append(sleeper.poll() is None)
        return real_write(self, *args, **kwargs)

    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.2, pending_timeout_s=60)

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        """A retry through the Kubernetes launcher."""
        run_training_job(context, client, job, settings)
        return dg.MaterializeResult()

    Path.write_text = watch_write
    try:
        result = dg.materialize([checkpoint], raise_on_error=False)
    finally:
        Path.write_text = real_write
        cluster.close()
    assert not result.success  # this attempt's own config error, as intended
    assert cluster.calls[:3] == [f"create Job {job.name}", f"delete Job {job.name}", f"create Job {job.name}"]
    assert sleeper.poll() is not None and written_while_orphan_ran == [False]
