"""Helpers for the Kubernetes tests: one pinned schema version for every manifest, small jobs."""

from __future__ import annotations

from typing import Any, Iterable

import kubernetes_validate

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
