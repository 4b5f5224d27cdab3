"""Helpers for the Kubernetes tests: one pinned schema version for every manifest, small jobs."""

from __future__ import annotations

from typing import Any, Iterable

import kubernetes_validate

from kubernetes.client import V1Node, V1NodeSpec, V1NodeStatus, V1ObjectMeta, V1Taint

from resources.k8s.manifests import PodSettings, SecretEnv
from resources.launch.base import GpuRequest, TrainingJob

# The Kubernetes minor version every manifest is validated against (kubernetes-validate ships
# its schemas, so this runs offline). Chart.yaml's kubeVersion starts at the same minor.
K8S_VERSION = "1.31"


def validate_all(manifests: Iterable[dict[str, Any]]) -> int:
    """Validate each manifest strictly (unknown fields fail); return how many were checked."""
    count = 0
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        count += 1
    return count


def make_job(
    *, name: str = "digits-1a2b3c4d", nnodes: int = 1, nproc: int = 1, gpus: int | None = None,
    **gpu: Any,
) -> TrainingJob:
    gpus = nproc if gpus is None else gpus
    return TrainingJob(
        name=name,
        config={"output_dir": "/mnt/training/digits/out", "checkpoint": {"dir": "/mnt/training/digits/ckpt"}},
        nproc_per_node=nproc,
        nnodes=nnodes,
        gpu=GpuRequest(nodes=nnodes, gpus_per_node=gpus, **gpu),
    )


def pod_settings() -> PodSettings:
    return PodSettings(
        namespace="model-factory",
        image="registry.example.com/model-factory/training:abc123",
        secret_env=(
            SecretEnv(env="AWS_ACCESS_KEY_ID", secret="model-factory-s3", key="AWS_ACCESS_KEY_ID"),
            SecretEnv(
                env="AWS_SECRET_ACCESS_KEY", secret="model-factory-s3", key="AWS_SECRET_ACCESS_KEY"
            ),
        ),
    )


GPU_TAINT = V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def node(name, *, labels=None, taints=None, unschedulable=None, cpu="64", memory="512Gi", **extra):
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    allocatable.update({k.replace("__", "/").replace("_", "-"): v for k, v in extra.items()})
    return V1Node(
        metadata=V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **(labels or {})}),
        spec=V1NodeSpec(taints=taints, unschedulable=unschedulable),
        status=V1NodeStatus(allocatable=allocatable, capacity=dict(allocatable)),
    )


def h100(name, gpus="8", **kw):
    # The smallest common 8 x H100 shape (96 vCPU, 1.9 TiB, as on Azure ND H100 v5): the default
    # per-GPU pod size (resources/launch/base.py) must fit an 8-GPU pod on it.
    kw = {"cpu": "96", "memory": "1900Gi", **kw}
    return node(name, labels={"nvidia.com/gpu.product": "H100"}, taints=[GPU_TAINT],
                **{"nvidia.com__gpu": gpus}, **kw)
