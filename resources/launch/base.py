"""The training launcher interface: the local one runs torchrun subprocesses, the Kubernetes one
runs GPU pods. Both run ``python -m training_runtime --config FILE`` and carry rank 0's Dagster
Pipes messages back to the asset that launched them."""

from __future__ import annotations

import functools
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dagster as dg

    from training_runtime.observe.attempts import LaunchOutcome


# Pod size per GPU, chosen for 8-GPU H100/H200 nodes so that an 8-GPU pod still fits the smallest
# common one (96 vCPU and 1.9 TiB on Azure ND H100/H200 v5; DGX/HGX and the other clouds' shapes have
# 192-224 vCPU and 2 TiB) after the kubelet's reservation and the daemonsets. Recipes override them
# (core/spec.py Recipe.cpu_per_gpu, ...). A MIG slice counts as one GPU here: recipes that train on
# slices should lower these.
#
# CPU: each rank's Python thread launches the kernels (small kernels are launch-bound), and beside it
# run NCCL's proxy thread, the loader's gathering and decoding threads, pinned-memory copies and the
# async checkpoint writer.
DEFAULT_CPU_PER_GPU = 10.0
# Host memory: each rank's pinned batches and prefetched shards, and when FSDP saves or resumes full
# state, rank 0 holds the whole model and optimizer state in host memory (about 12 bytes per
# parameter with Adam, plus a copy while writing). Host RAM at least equal to the GPU's HBM (80 GB on
# H100, 141 GB on H200) is the usual rule; 96 GiB keeps an 8-GPU pod under 1 TiB. Multi-node FSDP
# gathers every node's shards in pod 0, so such recipes raise it.
DEFAULT_MEMORY_GIB_PER_GPU = 96.0
# /dev/shm: NCCL's shared-memory transport between ranks of one pod and the worker processes of a
# custom loop's DataLoader. Memory-backed, so it counts against the pod's memory limit.
DEFAULT_SHM_GIB_PER_GPU = 4.0
# No pod gets less; CPU-only (gloo) pods get exactly this.
MIN_CPU = 2.0
MIN_MEMORY_GIB = 8.0
MIN_SHM_GIB = 2.0

# A Kubernetes resource quantity as written by hand: "4", "500m", "1.5", "64Gi", "512Mi", "1e3".
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def pod_sizing_problems(*, cpu_per_gpu: Any, memory_gib_per_gpu: Any, shm_gib_per_gpu: Any) -> list[tuple[str, str]]:
    """(field, problem) for each per-GPU size that cannot make a pod; empty when all can."""
    problems = []
    values = {"cpu_per_gpu": cpu_per_gpu, "memory_gib_per_gpu": memory_gib_per_gpu,
              "shm_gib_per_gpu": shm_gib_per_gpu}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            problems.append((name, f"{value!r} must be a positive number"))
    if not problems and shm_gib_per_gpu >= memory_gib_per_gpu:
        problems.append(("shm_gib_per_gpu", f"{shm_gib_per_gpu} GiB must stay below memory_gib_per_gpu "
                         f"({memory_gib_per_gpu} GiB): /dev/shm is memory-backed and counts against the "
                         "pod's memory limit"))
    if not problems and round(cpu_per_gpu * 1000) < 1:
        problems.append(("cpu_per_gpu", f"{cpu_per_gpu} is below one millicore (0.001)"))
    return problems


def parse_quantity(value: Any):
    """A Kubernetes quantity as a ``Decimal``: the client library's own ``parse_quantity``, loaded
    from its module file alone where the package is not imported yet. ``from kubernetes.utils
    import parse_quantity`` runs the ``kubernetes`` package's ``__init__``, which imports the whole
    API client: 0.55 s, paid by every process that builds a pipeline spec (its placement checks
    compare quantities), though the module needs only ``decimal``."""
    return _quantity_module().parse_quantity(value)


@functools.cache
def _quantity_module():
    import importlib.util
    import sys

    if "kubernetes.utils.quantity" in sys.modules:
        return sys.modules["kubernetes.utils.quantity"]
    package = importlib.util.find_spec("kubernetes")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("the kubernetes client is not installed (pip install kubernetes)")
    path = Path(package.submodule_search_locations[0]) / "utils" / "quantity.py"
    spec = importlib.util.spec_from_file_location("resources.launch._kubernetes_quantity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_quantity(value: Any) -> bool:
    """Whether `value` is a Kubernetes resource quantity as written by hand ("8", "500m", "64Gi")."""
    return isinstance(value, str) and bool(_QUANTITY.match(value))


def cpu_quantity(cores: float) -> str:
    """Cores as a Kubernetes quantity: whole cores plain ("80"), others in millicores ("1500m")."""
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory_quantity(gib: float) -> str:
    """GiB as a Kubernetes quantity: whole GiB as "768Gi", others in MiB ("1536Mi")."""
    mib = round(gib * 1024)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


@dataclass(frozen=True, kw_only=True)
class GpuRequest:
    """What a training job asks of the cluster. The local launcher uses only ``gpus_per_node``:
    it gives the run that many of the machine's GPUs (CUDA_VISIBLE_DEVICES), none for 0."""

    nodes: int = 1
    gpus_per_node: int = 0
    resource_name: str = "nvidia.com/gpu"  # or a MIG profile such as nvidia.com/mig-1g.10gb
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    # Pod size, scaled by the GPU count (see the DEFAULT_* above), never under the MIN_* floor.
    cpu_per_gpu: float = DEFAULT_CPU_PER_GPU
    memory_gib_per_gpu: float = DEFAULT_MEMORY_GIB_PER_GPU
    shm_gib_per_gpu: float = DEFAULT_SHM_GIB_PER_GPU
    # Fixed sizes (Kubernetes quantities) instead of the scaled ones, for pods sized by hand.
    cpu: str | None = None
    memory: str | None = None  # request and limit
    shm_size: str | None = None
    priority_class: str | None = None  # None: the launcher picks the chart's class by run origin
    # A pod `affinity` (core/placement.py validates it when definitions load); None: none.
    affinity: dict[str, Any] | None = None
    # NCCL_* / TORCH_NCCL_* settings for this job's pods (e.g. NCCL_DEBUG); the fabric's own settings
    # come from the cluster's RDMA profile (resources/k8s/fabric.py), these override them.
    nccl_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = pod_sizing_problems(cpu_per_gpu=self.cpu_per_gpu, memory_gib_per_gpu=self.memory_gib_per_gpu,
                                       shm_gib_per_gpu=self.shm_gib_per_gpu)
        if problems:
            name, problem = problems[0]
            raise ValueError(f"GpuRequest.{name}: {problem}")
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ValueError(f"GpuRequest.gpus_per_node={self.gpus_per_node!r} must be 0 (CPU only) or more")
        for name in ("cpu", "memory", "shm_size"):
            value = getattr(self, name)
            if value is not None and not is_quantity(value):
                raise ValueError(f"GpuRequest.{name}={value!r} is not a Kubernetes quantity such as '8', '500m' "
                                 "or '64Gi'; or leave it None to size the pod per GPU")

    @property
    def cpu_request(self) -> str:
        """The trainer container's CPU request."""
        return self.cpu or cpu_quantity(max(MIN_CPU, self.cpu_per_gpu * self.gpus_per_node))

    @property
    def memory_request(self) -> str:
        """The trainer container's memory request, and its limit."""
        return self.memory or memory_quantity(max(MIN_MEMORY_GIB, self.memory_gib_per_gpu * self.gpus_per_node))

    @property
    def shm_limit(self) -> str:
        """The size of the memory-backed /dev/shm volume."""
        return self.shm_size or memory_quantity(max(MIN_SHM_GIB, self.shm_gib_per_gpu * self.gpus_per_node))


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """One distributed training launch."""

    name: str  # a DNS-safe name, unique per launch (the Kubernetes Job/Service name)
    config: dict[str, Any]  # the runtime's config (training_runtime.config), JSON-serialisable
    nproc_per_node: int
    nnodes: int = 1  # the gang's nodes; an elastic gang's most
    min_nodes: int | None = None  # an elastic gang's fewest nodes (None: a fixed gang of nnodes)
    max_restarts: int = 0

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    @property
    def nnodes_arg(self) -> str:
        """torchrun's --nnodes: ``N``, or ``MIN:MAX`` for an elastic gang."""
        return f"{self.min_nodes}:{self.nnodes}" if self.elastic else str(self.nnodes)
    gpu: GpuRequest = field(default_factory=GpuRequest)
    env: dict[str, str] = field(default_factory=dict)  # non-secret settings only
    # The orchestrator's code version (core.code_version): a pod's image must record the same one.
    code_version: dict[str, Any] | None = None
    # The platform team (PipelineSpec.team): with Kueue on, the Job queues in that team's LocalQueue.
    team: str | None = None


class TrainingLauncher(ABC):
    @abstractmethod
    def launch(
        self, context: dg.AssetExecutionContext | dg.OpExecutionContext, job: TrainingJob
    ) -> dg.PipesClientCompletedInvocation:
        """Run the job to completion, forwarding Pipes messages; raise on failure."""

    def log_dir(self, job: TrainingJob) -> Path | None:
        """Where this launcher keeps the job's worker output, one ``launch_<k>`` folder per launch
        (layout in rank_logs.py), readable from the process that launched it once ``launch``
        returns or raises; None when it keeps none."""
        return None

    def failure_of(self, job: TrainingJob) -> LaunchOutcome | None:
        """Why this launch of ``job`` failed, in the runtime's words, and whether a retry can fix it:
        read from the attempt records the ranks leave beside the checkpoints
        (training_runtime/observe/attempts.py). Both launchers' workers write them to a volume the
        launching process sees at the same path (the Kubernetes step pod mounts the training
        volume). None when the workers left none (killed before they could write)."""
        from training_runtime.observe.attempts import attempts_root, launch_outcome

        return launch_outcome(attempts_root(job.config["checkpoint"]["dir"]), int(job.config.get("launch", 1)))
