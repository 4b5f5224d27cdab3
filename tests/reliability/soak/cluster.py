"""The Kubernetes path of the soak: the platform's Kubernetes launcher, unchanged, against the pod
simulation of tests/k8s/local_cluster.py (a stand-in API server whose "kubelets" run each pod
as a local process group from the manifest's own command and env).

Each launch gets a LocalCluster inside the run worker (the step pod): the launcher builds and
validates the Indexed Job and Service, checks feasibility against the cluster's two CPU nodes,
reads rank 0's Pipes messages from pod 0's log (an elastic gang's from the shared volume), keeps
the pods' logs and deletes the Job. An elastic gang (digits: 1-2 pods) gets its rendezvous store
pod and the Job controller's replacement of a lost pod ELASTIC_REPLACEMENT_S later. The
Jobs live in one registry on disk (``SharedLocalCluster``), as they live in the API server: when
a step pod is killed its Job keeps running, and the retry's launcher finds it, deletes it and
waits for its pods to go before it starts its own (TrainingJobClient.replace_previous). The soak's faults delete pods and lose a node by signalling the pods' process groups, as a
kubelet ending a deleted pod (SIGTERM) or a node vanishing (SIGKILL) would (faults.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import uuid
from pathlib import Path

from kubernetes.client import V1Job, V1JobStatus, V1ObjectMeta, V1Pod, V1PodStatus
from kubernetes.client.exceptions import ApiException
from pydantic import Field

from core.code_version import code_version
from resources.k8s.client import TrainingJobClient
from resources.k8s.launcher import KubernetesTrainingLauncher, run_training_job
from resources.k8s.manifests import JOB_LABEL, with_run_priority
from resources.launch.base import TrainingLauncher
from resources.platform import TrainingLauncherResource
from tests.k8s.helpers import node
from tests.k8s.local_cluster import LocalCluster, _BatchApi, _CoreApi, _not_found
from tests.support.ports import free_ports
from training_runtime.observe.build_info import BUILD_INFO_ENV, build_record
from training_runtime.observe.pipes import LEDGER_ENV

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "model-factory"
IMAGE = "registry.example.com/model-factory/training:soak"
IMAGE_ID = f"docker-pullable://registry.example.com/model-factory/training@sha256:{'5a' * 32}"
NODES = ("soak-node-a", "soak-node-b")  # pod i runs on NODES[i % 2] (LocalCluster._node_for)
# A lost pod of an elastic gang is replaced this long after it is gone (the time a cluster takes
# to find room again). Longer than the survivors' re-formation (the rendezvous lease, about 15 s,
# plus ELASTIC_LAST_CALL_S), so the gang is seen to go on smaller before it grows back; a
# replacement that came sooner would join the re-forming round and no resize would show.
ELASTIC_REPLACEMENT_S = 25.0
# The rendezvous' last call (30 s on a real cluster): how long a round with at least min_nodes
# waits for more. Short here, as in tests/k8s/test_elastic_pods.py, so a re-formation fits a soak.
ELASTIC_LAST_CALL_S = 2


def cluster_secrets(environ: dict[str, str] | os._Environ) -> dict[str, dict[str, str]]:
    """The chart's training Secrets: the S3 key and the lakeFS key (pods read shards through the
    lakeFS test server's S3 gateway, which takes lakeFS's keys). Without the soak's lakeFS (a
    platform on the local store, whose pods read shards from files) the keys are placeholders:
    the pods' manifests still name both Secrets, and a missing one would keep them waiting."""
    key = environ.get("SOAK_LAKEFS_ACCESS_KEY_ID", "AKIASIMULATED")
    secret = environ.get("SOAK_LAKEFS_SECRET_ACCESS_KEY", "simulated-secret")
    return {"model-factory-s3": {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret},
            "model-factory-lakefs": {"LAKEFS_ACCESS_KEY_ID": key, "LAKEFS_SECRET_ACCESS_KEY": secret}}


class SharedLocalCluster(LocalCluster):
    """A LocalCluster whose Jobs are registered in ``registry`` (one JSON file per live Job: its
    pods' names and process groups), so another step pod's cluster sees and deletes them."""

    def __init__(self, workdir: Path, registry: Path, **kwargs):
        super().__init__(workdir, **kwargs)
        self.registry = registry
        self.registry.mkdir(parents=True, exist_ok=True)
        self.batch = _SharedBatchApi(self)
        self.core = _SharedCoreApi(self)

    def _entry(self, name: str) -> Path:
        return self.registry / f"{name}.json"

    def register(self, name: str) -> None:
        """Job ``name``'s live pods, its replacements and its rendezvous store pod included (a
        retry's launcher must end them all when this step pod is killed)."""
        job = self.jobs[name]
        pods = {p.name: p.proc.pid for p in job.pods if p.proc is not None and p.proc.poll() is None}
        pods.update({p.name: p.proc.pid for p, body in self.bare_pods.values()
                     if p.proc is not None and p.proc.poll() is None
                     and any(o.get("uid") == job.uid for o in body["metadata"].get("ownerReferences", []))})
        # A pod's process group is its pid (pods start in sessions of their own).
        self._entry(name).write_text(json.dumps({"pods": pods}))

    def _start_pod(self, job, index: int):
        pod = super()._start_pod(job, index)
        name = job.manifest["metadata"]["name"]
        if name in self.jobs and self._entry(name).exists():  # a replacement: the Job is registered
            self.register(name)
        return pod

    def _start_bare_pod(self, body: dict) -> None:
        super()._start_bare_pod(body)
        owners = {o.get("uid") for o in body["metadata"].get("ownerReferences", [])}
        for name, job in self.jobs.items():
            if job.uid in owners:
                self.register(name)

    def unregister(self, name: str) -> None:
        self._entry(name).unlink(missing_ok=True)

    def foreign_pods(self, name: str) -> dict[str, int]:
        """Live pods (name -> process group) of Job ``name`` created by another step pod."""
        if name in self.jobs or not self._entry(name).exists():
            return {}
        pods = json.loads(self._entry(name).read_text())["pods"]
        return {pod: pgid for pod, pgid in pods.items() if _group_alive(pgid)}

    def delete_foreign(self, name: str) -> None:
        """What deleting the Job does to its pods: SIGTERM (the kubelet's grace), then SIGKILL."""
        for pgid in self.foreign_pods(name).values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        self._kill_after(name, grace_s=10.0)

    def _kill_after(self, name: str, grace_s: float) -> None:
        import threading

        def kill() -> None:
            for pgid in self.foreign_pods(name).values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            self.unregister(name)

        timer = threading.Timer(grace_s, kill)
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        names = list(self.jobs)
        super().close()
        for name in names:
            self.unregister(name)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


class _SharedBatchApi(_BatchApi):
    def create_namespaced_job(self, namespace: str, body: dict) -> V1Job:
        name = body["metadata"]["name"]
        if self.c.foreign_pods(name):
            raise ApiException(status=409, reason="AlreadyExists")
        job = super().create_namespaced_job(namespace, body)
        self.c.register(name)
        return job

    def read_namespaced_job_status(self, name: str, namespace: str) -> V1Job:
        pods = self.c.foreign_pods(name)
        if pods:
            return V1Job(metadata=V1ObjectMeta(name=name), status=V1JobStatus(active=len(pods)))
        if name not in self.c.jobs:
            self.c.unregister(name)  # its pods are gone: so is the Job
            raise _not_found("jobs.batch", name)
        return super().read_namespaced_job_status(name, namespace)

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str | None = None) -> None:
        if name not in self.c.jobs and self.c.foreign_pods(name):
            self.c.calls.append(f"delete Job {name} (another step pod's)")
            self.c.delete_foreign(name)
            return
        super().delete_namespaced_job(name, namespace, propagation_policy)
        self.c.unregister(name)


class _SharedCoreApi(_CoreApi):
    def list_namespaced_pod(self, namespace: str, label_selector: str = "", field_selector: str = ""):
        found = super().list_namespaced_pod(namespace, label_selector, field_selector)
        key, _, value = label_selector.partition("=")
        if key == JOB_LABEL:
            found.items += [V1Pod(metadata=V1ObjectMeta(name=pod, labels={JOB_LABEL: value}),
                                  status=V1PodStatus(phase="Running")) for pod in self.c.foreign_pods(value)]
        return found


class SimulatedKubernetesLauncher(KubernetesTrainingLauncher):
    """KubernetesTrainingLauncher whose API server and kubelets are a LocalCluster per launch."""

    cluster_root: str = Field(description="Folder of the simulated clusters' pod logs.")
    pod_env: dict[str, str] = Field(default_factory=dict,
                                    description="More env for every training pod, as the image would set it.")

    def launch(self, context, job):
        workdir = Path(self.cluster_root) / f"{job.name}-{uuid.uuid4().hex[:6]}"
        workdir.mkdir(parents=True)
        # The "image": this checkout, with the BUILD.json its build would record.
        build = workdir / "BUILD.json"
        version = job.code_version or code_version()
        build.write_text(json.dumps(build_record(git_sha=version["git_sha"], dirty=bool(version["dirty"]))))
        image_env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                     BUILD_INFO_ENV: str(build)}
        if os.environ.get(LEDGER_ENV):  # pods see only their manifest's env
            image_env[LEDGER_ENV] = os.environ[LEDGER_ENV]
        image_env.update(self.pod_env)
        # image_env: what the image gives a pod that has no env of the Job's (the rendezvous store pod)
        cluster = SharedLocalCluster(workdir, Path(self.cluster_root) / "jobs", secrets=cluster_secrets(os.environ),
                                     image_id=IMAGE_ID, nodes=[node(n, cpu="4", memory="16Gi") for n in NODES],
                                     replacement_delay_s=ELASTIC_REPLACEMENT_S, image_env=image_env)
        client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.5, pending_timeout_s=120,
                                   deletion_timeout_s=60)
        (port,) = free_ports(1)  # each Job's rendezvous on a port of its own: they share loopback
        settings = dataclasses.replace(self.pod_settings(), rendezvous_port=port, rendezvous_join_timeout_s=120,
                                       rendezvous_last_call_s=ELASTIC_LAST_CALL_S)
        job = dataclasses.replace(job, env={**job.env, **image_env})
        try:
            return run_training_job(context, client, with_run_priority(job, settings, context.run.tags), settings,
                                    check_nodes=self.check_feasibility, expected_code_version=version)
        finally:
            cluster.close()


class SimulatedClusterLauncherResource(TrainingLauncherResource):
    """The launcher resource of the soak's Kubernetes path (profile.py)."""

    cluster_root: str = Field(description="Folder of the simulated clusters' pod logs.")
    pod_env: dict[str, str] = Field(default_factory=dict,
                                    description="More env for every training pod, as the image would set it.")

    def get(self) -> TrainingLauncher:
        return SimulatedKubernetesLauncher(namespace=NAMESPACE, image=IMAGE, shared_mount_path=self.work_root,
                                           cluster_root=self.cluster_root, load_incluster_config=False,
                                           poll_interval_s=0.5, pod_env=dict(self.pod_env))
