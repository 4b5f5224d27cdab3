"""The training launcher interface: the local one runs torchrun subprocesses, the Kubernetes one
runs GPU pods. Both run ``python -m training_runtime --config FILE`` and carry rank 0's Dagster
Pipes messages back to the asset that launched them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dagster as dg


@dataclass(frozen=True, kw_only=True)
class GpuRequest:
    """What a training job asks of the cluster. Ignored by the local launcher (it uses CUDA if
    present, otherwise gloo on CPU)."""

    nodes: int = 1
    gpus_per_node: int = 0
    resource_name: str = "nvidia.com/gpu"  # or a MIG profile such as nvidia.com/mig-1g.10gb
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    cpu: str = "2"
    memory: str = "8Gi"
    shm_size: str = "2Gi"
    priority_class: str | None = None
    # NCCL_* / TORCH_NCCL_* settings for this job's pods (e.g. NCCL_SOCKET_IFNAME, NCCL_IB_HCA);
    # they differ per cluster fabric, so they travel with the request, not with the image.
    nccl_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """One distributed training launch."""

    name: str  # a DNS-safe name, unique per launch (the Kubernetes Job/Service name)
    config: dict[str, Any]  # the runtime's config (training_runtime.config), JSON-serialisable
    nproc_per_node: int
    nnodes: int = 1
    max_restarts: int = 0
    gpu: GpuRequest = field(default_factory=GpuRequest)
    env: dict[str, str] = field(default_factory=dict)  # non-secret settings only


class TrainingLauncher(ABC):
    @abstractmethod
    def launch(
        self, context: dg.AssetExecutionContext | dg.OpExecutionContext, job: TrainingJob
    ) -> dg.PipesClientCompletedInvocation:
        """Run the job to completion, forwarding Pipes messages; raise on failure."""
