"""Kubernetes side of the platform: pure manifest builders, the GPU feasibility check, per-step
`dagster-k8s/config` values, and the KubernetesTrainingLauncher that submits and watches Jobs."""

from resources.k8s.feasibility import InfeasibleGpuRequest, PodStuckPending, check_feasibility
from resources.k8s.launcher import KubernetesTrainingLauncher, launcher_kwargs, run_training_job
from resources.k8s.manifests import (
    PodSettings,
    SecretEnv,
    build_headless_service,
    build_manifests,
    build_training_job,
)
from resources.k8s.step_config import (
    k8s_executor_config,
    platform_settings,
    step_k8s_config,
)

__all__ = [
    "InfeasibleGpuRequest",
    "KubernetesTrainingLauncher",
    "PodSettings",
    "PodStuckPending",
    "SecretEnv",
    "build_headless_service",
    "build_manifests",
    "build_training_job",
    "check_feasibility",
    "k8s_executor_config",
    "launcher_kwargs",
    "platform_settings",
    "run_training_job",
    "step_k8s_config",
]
