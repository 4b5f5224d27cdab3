"""An elastic gang's Kubernetes objects: torchrun with --nnodes=MIN:MAX against a rendezvous store
in a pod of its own, an Indexed Job that replaces lost pods instead of failing, Kueue's partial
admission, every object validated against the Kubernetes 1.31 schemas; a fixed gang's unchanged."""

from __future__ import annotations

import dataclasses

from kubernetes.client import V1Pod, V1PodStatus, V1ObjectMeta

from resources.k8s.client import TrainingJobClient
from resources.k8s.kueue import KueueSettings, QUEUE_LABEL
from resources.k8s.manifests import (
    JOB_LABEL,
    KUEUE_MIN_PARALLELISM,
    RENDEZVOUS_LABEL,
    build_manifests,
    rendezvous_endpoint,
    rendezvous_store_name,
    torchrun_args,
)
from tests.k8s.helpers import make_job, validate_all


def _elastic(nnodes=3, min_nodes=2, **kw):
    job = make_job(nnodes=nnodes, nproc=2, gpus=0, **kw)
    return dataclasses.replace(job, min_nodes=min_nodes, max_restarts=4, team="ml")


def _env(job_manifest):
    (container,) = job_manifest["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_an_elastic_gang_runs_against_a_store_no_node_hosts(settings):
    job = _elastic()
    manifests = build_manifests(job, settings)
    assert [m["kind"] for m in manifests] == ["Job", "Service", "Pod", "Service"]
    assert validate_all(manifests) == 4
    args = torchrun_args(job, settings)
    store = rendezvous_store_name(job)
    assert "--nnodes=2:3" in args and "--max-restarts=4" in args
    assert f"--rdzv-endpoint={store}.model-factory.svc.cluster.local:{settings.rendezvous_port}" in args
    assert rendezvous_endpoint(job, settings).startswith(store + ".")
    conf = next(a for a in args if a.startswith("--rdzv-conf="))
    assert "is_host=false" in conf and f"read_timeout={settings.rendezvous_join_timeout_s}" in conf
    env = _env(manifests[0])
    assert env["PLATFORM_ELASTIC"] == "2:3" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"

    pod, service = manifests[2], manifests[3]
    assert pod["metadata"]["name"] == service["metadata"]["name"] == store and len(store) <= 63
    # The store is not one of the gang's pods: the launcher counts those by JOB_LABEL.
    assert JOB_LABEL not in pod["metadata"]["labels"] and pod["metadata"]["labels"][RENDEZVOUS_LABEL] == job.name
    assert service["spec"]["selector"] == {RENDEZVOUS_LABEL: job.name}
    (c,) = pod["spec"]["containers"]
    assert c["command"][:3] == ["python", "-m", "training_runtime.distributed.rendezvous_store"]
    assert c["image"] == settings.image and "nvidia.com/gpu" not in c["resources"]["requests"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_elastic_job_replaces_lost_pods_and_completes_with_the_first_that_ends(settings):
    spec = build_manifests(_elastic(nnodes=4, min_nodes=2), settings)[0]["spec"]
    assert (spec["completions"], spec["parallelism"]) == (4, 4)
    assert "backoffLimit" not in spec  # a lost pod no longer fails the whole gang
    assert spec["backoffLimitPerIndex"] == 4 and spec["maxFailedIndexes"] == 2
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    assert spec["successPolicy"] == {"rules": [{"succeededCount": 1}]}


def test_kueue_admits_an_elastic_gang_from_min_nodes_pods(settings):
    kueue = KueueSettings(queues={"ml": "model-factory-ml"}, training_priority_class="model-factory-training",
                          adhoc_priority_class="model-factory-adhoc")
    queued = dataclasses.replace(settings, kueue=kueue)
    manifests = build_manifests(_elastic(), queued)
    job = manifests[0]
    assert validate_all(manifests) == 4
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE_LABEL] == "model-factory-ml"
    assert job["metadata"]["annotations"] == {KUEUE_MIN_PARALLELISM: "2"}
    fixed = build_manifests(dataclasses.replace(_elastic(), min_nodes=None), queued)[0]
    assert "annotations" not in fixed["metadata"]


def test_a_fixed_gang_keeps_pod_0_as_its_store_and_fails_at_a_lost_pod(settings):
    job = dataclasses.replace(_elastic(), min_nodes=None)
    manifests = build_manifests(job, settings)
    assert [m["kind"] for m in manifests] == ["Job", "Service"]
    assert manifests[0]["spec"]["backoffLimit"] == 0 and "successPolicy" not in manifests[0]["spec"]
    args = torchrun_args(job, settings)
    assert "--nnodes=3" in args and not any("is_host" in a for a in args)
    assert "PLATFORM_ELASTIC" not in _env(manifests[0])
    # min_nodes == nnodes is a fixed gang too
    assert "--nnodes=3" in torchrun_args(dataclasses.replace(job, min_nodes=3), settings)


class _Api:
    """The few calls of the Kubernetes API that wait_started makes."""

    def __init__(self, phases):
        self.phases = phases

    def list_namespaced_pod(self, namespace, label_selector):
        return type("L", (), {"items": [V1Pod(metadata=V1ObjectMeta(name=f"p-{i}", annotations={}),
                                              status=V1PodStatus(phase=p)) for i, p in enumerate(self.phases)]})()

    def read_namespaced_job_status(self, name, namespace):
        return type("J", (), {"status": type("S", (), {"conditions": None, "succeeded": None, "failed": None,
                                                       "active": 3})(), "spec": type("P", (), {"suspend": False})()})()


def test_an_elastic_gang_starts_once_min_nodes_pods_run_and_others_still_wait():
    api = _Api(["Running", "Running", "Pending"])
    client = TrainingJobClient.__new__(TrainingJobClient)
    client.core_api = client.batch_api = api
    client.pending_timeout_s, client.poll_interval_s = 0.0, 0.0
    client._clock, client._sleep = (lambda: 0.0), (lambda s: None)
    client._events = lambda pod, namespace: []
    assert len(client.wait_started("j", "ns", 2, others_may_wait=True)) == 3
