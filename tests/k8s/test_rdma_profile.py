"""The InfiniBand/RoCE profile of multi-node training: from the chart's values through its ConfigMap
to the pods, off by default, validated at every step, and every object it shapes valid for
Kubernetes 1.31."""

from __future__ import annotations

import dataclasses

import pytest

from resources.k8s.fabric import (
    CHART_VALUE,
    ENV_ENABLED,
    ENV_GID_INDEX,
    ENV_IPC_LOCK,
    ENV_RESOURCE,
    ENV_RESOURCE_COUNT,
    ENV_TRANSPORT,
    RdmaProfile,
    RdmaProfileError,
    rdma_profile,
)
from resources.k8s.feasibility import InfeasibleGpuRequest, check_feasibility
from resources.k8s.launcher import KubernetesTrainingLauncher, launcher_kwargs
from resources.k8s.manifests import build_manifests, build_training_job
from resources.k8s.step_config import platform_settings
from tests.k8s.helpers import GPU_TOLERATION, h100, make_job, validate_all
from tests.k8s.test_helm import by_kind, render

PIPES = {"DAGSTER_PIPES_CONTEXT": "e30=", "DAGSTER_PIPES_MESSAGES": "e30="}
IB = RdmaProfile(transport="infiniband", resource_name="rdma/ib", hca="=mlx5_0:1,mlx5_1:1", gdr_level="PHB")
ROCE = RdmaProfile(transport="roce", resource_name="rdma/rdma_shared_device_a", gid_index=3, hca="mlx5")


def _trainer(manifest):
    return manifest["spec"]["template"]["spec"]["containers"][0]


def _env(manifest):
    return {e["name"]: e.get("value") for e in _trainer(manifest)["env"]}


def _rdma_docs(settings, profile, **job):
    docs = build_manifests(make_job(**{"nnodes": 2, "nproc": 8, **job}), dataclasses.replace(settings, rdma=profile),
                           PIPES)
    assert validate_all(docs) == len(docs)
    return docs


def test_off_by_default_nccl_uses_tcp_on_the_pod_network(settings):
    assert settings.rdma is None and rdma_profile({}) is None and rdma_profile({ENV_ENABLED: "false"}) is None
    (job, _service) = build_manifests(make_job(nnodes=2, nproc=8), settings, PIPES)
    container = _trainer(job)
    assert not [k for k in _env(job) if k.startswith("NCCL_IB")]
    assert set(container["resources"]["requests"]) == {"cpu", "memory", "nvidia.com/gpu"}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("profile, nccl", [
    (IB, {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
          "NCCL_NET_GDR_LEVEL": "PHB"}),
    (ROCE, {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3"}),
], ids=["infiniband", "roce"])
def test_multi_node_pods_get_the_device_the_capability_and_nccl_settings(settings, profile, nccl):
    job, service = _rdma_docs(settings, profile)
    container = _trainer(job)
    res = container["resources"]
    assert res["requests"][profile.resource_name] == res["limits"][profile.resource_name] == "1"
    assert res["requests"]["nvidia.com/gpu"] == "8"
    # Still least privilege: everything dropped, IPC_LOCK alone added back; no host network.
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert not job["spec"]["template"]["spec"].get("hostNetwork")
    env = _env(job)
    assert {k: env[k] for k in nccl} == nccl
    assert not ({"NCCL_IB_GID_INDEX", "NCCL_NET_GDR_LEVEL", "NCCL_IB_HCA"} - set(nccl)) & set(env)
    assert service["kind"] == "Service"


def test_single_node_jobs_never_take_an_rdma_device(settings):
    (job,) = _rdma_docs(settings, IB, nnodes=1)
    container = _trainer(job)
    assert "rdma/ib" not in container["resources"]["requests"]
    assert "add" not in container["securityContext"]["capabilities"]
    assert "NCCL_IB_HCA" not in _env(job)


def test_the_jobs_own_nccl_settings_override_the_clusters(settings):
    job, _ = _rdma_docs(settings, IB, nccl_env={"NCCL_IB_HCA": "=mlx5_4", "NCCL_DEBUG": "INFO"})
    env = _env(job)
    assert env["NCCL_IB_HCA"] == "=mlx5_4" and env["NCCL_DEBUG"] == "INFO" and env["NCCL_IB_DISABLE"] == "0"


def test_without_ipc_lock_nothing_is_added_back(settings):
    job, _ = _rdma_docs(settings, dataclasses.replace(IB, ipc_lock=False, resource_count=2))
    container = _trainer(job)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["limits"]["rdma/ib"] == "2"


@pytest.mark.parametrize("change, field, says", [
    ({"transport": "ethernet"}, "transport", "use one of"),
    ({"resource_name": "rdma"}, "resourceName", "is not an extended resource name"),
    ({"resource_name": "kubernetes.io/rdma"}, "resourceName", "is not an extended resource name"),
    ({"resource_count": 0}, "resourcesPerPod", "at least 1"),
    ({"hca": "mlx5 0"}, "hca", "is not an NCCL_IB_HCA list"),
    ({"socket_ifname": ""}, "socketIfname", "is not an NCCL_SOCKET_IFNAME"),
    ({"gid_index": 3}, "gidIndex", "RoCE mode only"),
    ({"transport": "roce", "gid_index": -1}, "gidIndex", "0 or more"),
    ({"gdr_level": "NVL"}, "gdrLevel", "use one of"),
])
def test_bad_settings_name_the_chart_value_and_the_configmap_key(change, field, says):
    with pytest.raises(RdmaProfileError, match=rf"training\.rdma\.{field} \(MODEL_FACTORY_RDMA_\w+ in the "
                                              rf"model-factory-platform ConfigMap\): .*{says}"):
        RdmaProfile(**change)


@pytest.mark.parametrize("environ, says", [
    ({ENV_ENABLED: "maybe"}, r"training\.rdma\.enabled .* use true or false"),
    ({ENV_ENABLED: "true", ENV_RESOURCE_COUNT: "two"}, r"training\.rdma\.resourcesPerPod .* whole number"),
    ({ENV_ENABLED: "true", ENV_TRANSPORT: "roce", ENV_GID_INDEX: "3.5"}, r"training\.rdma\.gidIndex .* whole number"),
    ({ENV_ENABLED: "true", ENV_IPC_LOCK: "on"}, r"training\.rdma\.ipcLock .* use true or false"),
])
def test_bad_configmap_values_are_reported_as_chart_values(environ, says):
    with pytest.raises(RdmaProfileError, match=says):
        rdma_profile(environ)


@pytest.mark.parametrize("profile", [IB, ROCE, RdmaProfile(), dataclasses.replace(IB, ipc_lock=False)])
def test_the_configmap_form_round_trips(profile):
    assert rdma_profile(profile.to_environ()) == profile
    assert set(profile.to_environ()) <= set(CHART_VALUE)


def test_feasibility_counts_the_rdma_device():
    gpu = make_job(nnodes=2, nproc=8, tolerations=(GPU_TOLERATION,)).gpu
    without = [h100("gpu-a"), h100("gpu-b")]
    with_ib = [h100("gpu-a", **{"rdma__ib": "8"}), h100("gpu-b", **{"rdma__ib": "8"})]
    assert check_feasibility(gpu, with_ib, IB.resources()) == ["gpu-a", "gpu-b"]
    with pytest.raises(InfeasibleGpuRequest) as info:
        check_feasibility(gpu, without, IB.resources())
    msg = str(info.value)
    assert "1 x rdma/ib" in msg and "gpu-a: allocatable rdma/ib=0 < 1" in msg and "training.rdma" in msg


ROCE_VALUES = {"enabled": True, "transport": "roce", "resourceName": "rdma/rdma_shared_device_a",
               "hca": "=mlx5_0:1", "gidIndex": 3, "gdrLevel": "PXB"}


@pytest.mark.parametrize("rdma", [{}, {"enabled": True}, ROCE_VALUES, {"enabled": True, "ipcLock": False}],
                         ids=["off", "infiniband-defaults", "roce", "no-ipc-lock"])
def test_chart_to_pods_with_the_profile_on_and_off(settings, rdma):
    docs = render({"training": {"rdma": rdma}})
    assert validate_all(docs) == len(docs)
    (cm,) = by_kind(docs, "ConfigMap")
    chart = platform_settings(cm["data"])
    assert (chart.rdma is not None) == bool(rdma.get("enabled"))
    if chart.rdma is not None:
        assert chart.rdma.ipc_lock == rdma.get("ipcLock", True)
        assert chart.rdma.transport == rdma.get("transport", "infiniband")
        assert chart.rdma.gid_index == rdma.get("gidIndex")
    job = build_training_job(make_job(nnodes=2, nproc=8), chart, PIPES)
    validate_all([job])
    assert (chart.rdma is not None) == ("rdma/rdma_shared_device_a" in _trainer(job)["resources"]["requests"])
    # The launcher the orchestrator builds from the same environment carries the profile.
    environ = {**cm["data"]}
    launcher = KubernetesTrainingLauncher.from_settings(namespace="model-factory", image="img:1",
                                                       work_root="/mnt/training", environ=environ)
    assert launcher.pod_settings().rdma == chart.rdma
    assert KubernetesTrainingLauncher(**launcher_kwargs(chart)).pod_settings() == chart


@pytest.mark.parametrize("values, says", [
    ({"transport": "ethernet"}, "/training/rdma/transport"),
    ({"resourcesPerPod": 0}, "/training/rdma/resourcesPerPod"),
    ({"resourceName": "rdma"}, "/training/rdma/resourceName"),
    ({"gdrLevel": "NVL"}, "/training/rdma/gdrLevel"),
    ({"gidIndex": -1}, "/training/rdma/gidIndex"),
    ({"hcas": "mlx5"}, "hcas"),
])
def test_chart_schema_rejects_bad_rdma_values(values, says):
    with pytest.raises(Exception, match=says):
        render({"training": {"rdma": values}})


def test_created_namespace_must_allow_ipc_lock():
    own = {"name": "training", "create": True}
    with pytest.raises(Exception, match=r"Pod Security \\?\"baseline\\?\" rejects.*podSecurity.enforce=privileged"):
        render({"trainingNamespace": own, "training": {"rdma": {"enabled": True}}}, namespace="training")
    docs = render({"trainingNamespace": {**own, "podSecurity": {"enforce": "privileged"}},
                   "training": {"rdma": {"enabled": True}}}, namespace="training")
    (ns,) = by_kind(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # Without the capability, baseline stays.
    docs = render({"trainingNamespace": own, "training": {"rdma": {"enabled": True, "ipcLock": False}}},
                  namespace="training")
    assert by_kind(docs, "Namespace")[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_launcher_reads_nothing_when_the_profile_is_off():
    launcher = KubernetesTrainingLauncher.from_settings(namespace="ns", image="img", work_root="/mnt/training",
                                                       environ={"UNRELATED": "1", ENV_RESOURCE: "rdma/ib"})
    assert launcher.rdma == {ENV_RESOURCE: "rdma/ib"} and launcher.pod_settings().rdma is None
