"""The GPU feasibility check and the Pending diagnosis, on real kubernetes.client model objects."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from kubernetes.client import (
    CoreV1Event,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1JobCondition,
    V1JobStatus,
    V1ObjectMeta,
    V1ObjectReference,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
    V1Taint,
    V1Toleration,
)

from resources.k8s.feasibility import (
    InfeasibleGpuRequest,
    check_feasibility,
    failure_summary,
    job_outcome,
    pending_reason,
    pods_not_started,
    terminal_waiting_reason,
    tolerates,
)
from resources.launch.base import GpuRequest
from tests.k8s.helpers import GPU_TAINT, GPU_TOLERATION, h100, node

CLUSTER = [
    node("cpu-a"),
    node("cpu-b"),
    h100("gpu-a"),
    h100("gpu-b"),
    h100("gpu-c", gpus="4"),
    # A100 split into seven 1g.10gb MIG slices (mixed strategy: one resource per profile).
    node("mig-a", taints=[GPU_TAINT], **{"nvidia.com__mig_1g.10gb": "7"}),
]


def req(**kw):
    return GpuRequest(**{"tolerations": (GPU_TOLERATION,), **kw})


def test_fits_on_tolerated_gpu_nodes():
    assert check_feasibility(req(nodes=2, gpus_per_node=8), CLUSTER) == ["gpu-a", "gpu-b"]
    assert check_feasibility(req(nodes=3, gpus_per_node=4), CLUSTER) == ["gpu-a", "gpu-b", "gpu-c"]


def test_more_gpus_per_node_than_any_node_has_fails_at_once_with_every_reason():
    with pytest.raises(InfeasibleGpuRequest) as info:
        # cpu and memory fixed small: only the GPU count stands in the way
        check_feasibility(req(nodes=1, gpus_per_node=16, cpu="8", memory="64Gi"), CLUSTER)
    msg = str(info.value)
    assert "0 of 6 node(s) qualify with room for 0 pod(s)" in msg
    assert "gpu-a: allocatable nvidia.com/gpu=8 < 16" in msg
    assert "cpu-a: allocatable nvidia.com/gpu=0 < 16" in msg
    # The message lists what the cluster does offer, including MIG slices, and the fix.
    assert "nvidia.com/mig-1g.10gb on mig-a(7)" in msg
    assert "Fix:" in msg


def test_too_many_nodes_fails():
    with pytest.raises(InfeasibleGpuRequest, match=r"3 pod\(s\) needed.* 2 of 6 node\(s\) qualify with room for 2 pod\(s\)"):
        check_feasibility(req(nodes=3, gpus_per_node=8), CLUSTER)


def test_pods_may_share_a_node_with_room_for_them():
    # Two 4-GPU pods fit one 8-GPU node; three do not.
    assert check_feasibility(req(nodes=2, gpus_per_node=4), [h100("gpu-a")]) == ["gpu-a"]
    with pytest.raises(InfeasibleGpuRequest, match="room for 2 pod"):
        check_feasibility(req(nodes=3, gpus_per_node=4), [h100("gpu-a")])
    # CPU or memory can be the limit instead of GPUs.
    assert check_feasibility(req(nodes=1, gpus_per_node=1, cpu="60"), [h100("gpu-a")]) == ["gpu-a"]
    with pytest.raises(InfeasibleGpuRequest, match="room for 1 pod"):
        check_feasibility(req(nodes=2, gpus_per_node=1, cpu="60"), [h100("gpu-a")])


def test_untolerated_taint_blocks_gpu_nodes():
    with pytest.raises(InfeasibleGpuRequest, match="taint nvidia.com/gpu=present:NoSchedule not tolerated"):
        check_feasibility(GpuRequest(gpus_per_node=1), CLUSTER)


def test_prefer_no_schedule_taint_does_not_block():
    soft = node("soft", taints=[V1Taint(key="spot", value="true", effect="PreferNoSchedule")],
                **{"nvidia.com__gpu": "2"})
    assert check_feasibility(GpuRequest(gpus_per_node=2), [soft]) == ["soft"]


def test_mig_profile_fits_only_nodes_that_advertise_it():
    assert check_feasibility(req(gpus_per_node=1, resource_name="nvidia.com/mig-1g.10gb"), CLUSTER) == ["mig-a"]
    with pytest.raises(InfeasibleGpuRequest, match="mig-3g.40gb=0 < 1"):
        check_feasibility(req(gpus_per_node=1, resource_name="nvidia.com/mig-3g.40gb"), CLUSTER)


def test_node_selector_narrows_the_candidates():
    sel = {"nvidia.com/gpu.product": "A100"}
    with pytest.raises(InfeasibleGpuRequest, match="label nvidia.com/gpu.product='H100', selector wants 'A100'"):
        check_feasibility(req(gpus_per_node=1, node_selector=sel), CLUSTER)


def test_cordoned_node_and_cpu_memory_are_considered():
    cordoned = h100("gpu-x", unschedulable=True)
    small = h100("gpu-y", cpu="4", memory="16Gi")
    with pytest.raises(InfeasibleGpuRequest) as info:
        check_feasibility(req(gpus_per_node=1, cpu="8", memory="64Gi"), [cordoned, small])
    msg = str(info.value)
    assert "gpu-x: cordoned" in msg
    assert "gpu-y: allocatable cpu=4 < 8; allocatable memory=16Gi < 64Gi" in msg


def test_quantities_compare_numerically():
    n = h100("gpu-m", cpu="7500m", memory="65536Mi")
    assert check_feasibility(req(gpus_per_node=1, cpu="7", memory="64Gi"), [n]) == ["gpu-m"]


def test_no_gpu_nodes_hints_at_the_device_plugin():
    with pytest.raises(InfeasibleGpuRequest, match="device plugin"):
        check_feasibility(GpuRequest(gpus_per_node=1), [node("cpu-a")])


def test_toleration_semantics_match_kubernetes():
    taint = V1Taint(key="pool", value="gpu", effect="NoExecute")
    assert tolerates([{"operator": "Exists"}], taint)  # empty key + Exists: everything
    assert tolerates([{"key": "pool", "operator": "Equal", "value": "gpu"}], taint)  # any effect
    assert not tolerates([{"key": "pool", "operator": "Equal", "value": "cpu"}], taint)
    assert not tolerates([{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}], taint)
    assert tolerates([V1Toleration(key="pool", operator="Exists", effect="NoExecute")], taint)
    assert not tolerates([{"operator": "Equal", "value": "gpu"}], taint)


def pending_pod(name="train-0-abcde", *, conditions=None, waiting=None):
    statuses = None
    if waiting:
        statuses = [V1ContainerStatus(name="trainer", image="img", image_id="", ready=False,
                                      restart_count=0, state=V1ContainerState(waiting=waiting))]
    return V1Pod(metadata=V1ObjectMeta(name=name),
                 status=V1PodStatus(phase="Pending", conditions=conditions, container_statuses=statuses))


def test_pending_reason_quotes_the_scheduler():
    pod = pending_pod(conditions=[V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable",
        message="0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) had untolerated taint.")])
    event = CoreV1Event(
        metadata=V1ObjectMeta(name="e1"), involved_object=V1ObjectReference(name=pod.metadata.name),
        type="Warning", reason="FailedScheduling", message="0/6 nodes are available: preemption: 0/6",
        last_timestamp=datetime(2026, 11, 29, tzinfo=timezone.utc))
    reason = pending_reason(pod, [event])
    assert "Unschedulable: 0/6 nodes are available: 2 Insufficient nvidia.com/gpu" in reason
    assert "event FailedScheduling: 0/6 nodes are available: preemption" in reason


def test_pending_reason_reports_image_pull_backoff():
    pod = pending_pod(waiting=V1ContainerStateWaiting(reason="ImagePullBackOff", message="Back-off pulling image"))
    assert "container trainer ImagePullBackOff: Back-off pulling image" in pending_reason(pod)
    assert terminal_waiting_reason(pod) is None  # may recover (registry hiccup): wait for timeout


def test_missing_secret_is_terminal():
    pod = pending_pod(waiting=V1ContainerStateWaiting(
        reason="CreateContainerConfigError", message='secret "model-factory-s3" not found'))
    assert "secret \"model-factory-s3\" not found" in terminal_waiting_reason(pod)


def test_pods_not_started_and_job_outcome():
    running = V1Pod(metadata=V1ObjectMeta(name="r"), status=V1PodStatus(phase="Running"))
    assert pods_not_started([running, pending_pod()]) == [pending_pod()]
    assert job_outcome(V1JobStatus(active=2)) == "running"
    assert job_outcome(V1JobStatus(conditions=[V1JobCondition(type="Complete", status="True")])) == "succeeded"
    assert job_outcome(V1JobStatus(conditions=[
        V1JobCondition(type="FailureTarget", status="True"),
        V1JobCondition(type="Failed", status="True", reason="BackoffLimitExceeded")])) == "failed"


def test_failure_summary_names_the_pod_and_exit():
    status = V1JobStatus(conditions=[V1JobCondition(
        type="Failed", status="True", reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")])
    pod = V1Pod(metadata=V1ObjectMeta(name="train-1-xyz"), status=V1PodStatus(
        phase="Failed", container_statuses=[V1ContainerStatus(
            name="trainer", image="img", image_id="", ready=False, restart_count=0,
            state=V1ContainerState(terminated=V1ContainerStateTerminated(
                exit_code=137, reason="OOMKilled", message="line1\nCUDA out of memory")))]))
    summary = failure_summary(status, [pod])
    assert "Job BackoffLimitExceeded" in summary
    assert "pod train-1-xyz container trainer exited 137 (OOMKilled)" in summary
    assert "CUDA out of memory" in summary
