"""Can a GPU request ever be scheduled, and why is a pod still Pending?

Pure functions over the Kubernetes client's model objects (`V1Node`, `V1Pod`, `CoreV1Event`),
so they are tested against real objects without a cluster. The launcher calls them with what it
listed from the API.

"Ever" means against each node's *allocatable* resources, not what is free right now: a request
that fits an idle node waits in the queue; one that fits no node fails at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Mapping, Sequence

from kubernetes.client import CoreV1Event, V1Node, V1Pod
from kubernetes.utils import parse_quantity

from resources.launch.base import GpuRequest

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
# Waiting reasons that no amount of waiting fixes: fail at once instead of at the timeout.
TERMINAL_WAITING_REASONS = frozenset(
    {"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"}
)


class InfeasibleGpuRequest(ValueError):
    """No set of nodes in the cluster can ever hold the requested pods."""


class PodStuckPending(RuntimeError):
    """A training pod did not start within the configured time."""


@dataclass(frozen=True)
class NodeVerdict:
    name: str
    fits: bool
    reasons: tuple[str, ...]
    pods: int = 0  # how many pods of the request the node's allocatable resources could hold


def _toleration_get(t: Any, key: str) -> Any:
    if isinstance(t, Mapping):
        return t.get(key)
    return getattr(t, key, None)


def tolerates(tolerations: Sequence[Any], taint: Any) -> bool:
    """Kubernetes' toleration matching for one taint (dict or V1Toleration tolerations)."""
    for t in tolerations:
        op = _toleration_get(t, "operator") or "Equal"
        key = _toleration_get(t, "key")
        effect = _toleration_get(t, "effect")
        if effect and effect != taint.effect:
            continue
        if not key:
            # An empty key with Exists tolerates every taint.
            if op == "Exists":
                return True
            continue
        if key != taint.key:
            continue
        if op == "Exists" or (_toleration_get(t, "value") or "") == (taint.value or ""):
            return True
    return False


def _requirement_holds(req: Mapping[str, Any], labels: Mapping[str, str], name: str, field: bool) -> bool:
    """One nodeSelectorRequirement (matchExpressions on labels, matchFields on metadata.name)."""
    key, op, values = req.get("key"), req.get("operator"), [str(v) for v in req.get("values") or []]
    have = ({"metadata.name": name}.get(key) if field else labels.get(key))
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt"):
        try:
            number, bound = int(have), int(values[0])
        except (TypeError, ValueError, IndexError):
            return False  # the scheduler too treats a non-integer label as not matching
        return number > bound if op == "Gt" else number < bound
    raise ValueError(f"nodeAffinity operator {op!r} is not one the scheduler knows")


def _shown(req: Mapping[str, Any]) -> str:
    values = req.get("values")
    return f"{req.get('key')} {req.get('operator')}" + (f" {list(values)}" if values else "")


def _required_terms(affinity: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    node = (affinity or {}).get("nodeAffinity") or {}
    return (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []


def required_affinity_misses(affinity: Mapping[str, Any] | None, node: V1Node) -> list[str]:
    """Why `node` fails the pod's required node affinity (empty: it passes). Terms are ORed, the
    requirements of one term ANDed, as the scheduler does; pod (anti-)affinity depends on the pods
    running at the time, so it is left to the scheduler."""
    terms = _required_terms(affinity)
    if not terms:
        return []
    labels = node.metadata.labels or {}
    misses = []
    for i, term in enumerate(terms):
        failed = [_shown(r) for r in term.get("matchExpressions") or []
                  if not _requirement_holds(r, labels, node.metadata.name, field=False)]
        failed += [_shown(r) for r in term.get("matchFields") or []
                   if not _requirement_holds(r, labels, node.metadata.name, field=True)]
        if not failed:
            return []
        misses.append(f"term {i}: " + ", ".join(failed))
    return [f"required nodeAffinity not met ({'; '.join(misses)})"]


def _quantity(value: Any) -> Decimal:
    return parse_quantity(value) if value is not None else Decimal(0)


def judge_node(gpu: GpuRequest, node: V1Node, extra: Mapping[str, str] | None = None) -> NodeVerdict:
    """Whether one pod of the request could ever run on `node`, and if not, every reason why.

    `extra`: further extended resources each pod requests (the RDMA profile's device)."""
    reasons: list[str] = []
    labels = node.metadata.labels or {}
    if node.spec and node.spec.unschedulable:
        reasons.append("cordoned (spec.unschedulable)")
    for key, value in gpu.node_selector.items():
        if labels.get(key) != value:
            reasons.append(f"label {key}={labels.get(key)!r}, selector wants {value!r}")
    reasons += required_affinity_misses(gpu.affinity, node)
    for taint in (node.spec.taints if node.spec else None) or []:
        # PreferNoSchedule only steers the scheduler; it never blocks.
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerates(gpu.tolerations, taint):
            shown = f"{taint.key}={taint.value}" if taint.value else taint.key
            reasons.append(f"taint {shown}:{taint.effect} not tolerated")
    allocatable = (node.status.allocatable if node.status else None) or {}
    wanted = {"cpu": gpu.cpu_request, "memory": gpu.memory_request}
    if gpu.gpus_per_node:
        wanted[gpu.resource_name] = str(gpu.gpus_per_node)
    wanted.update(extra or {})
    capacity: list[int] = []
    for resource, amount in wanted.items():
        have, need = _quantity(allocatable.get(resource)), parse_quantity(amount)
        if have < need:
            reasons.append(f"allocatable {resource}={allocatable.get(resource, 0)} < {amount}")
        elif need > 0:
            capacity.append(int(have // need))
    pods = min(capacity) if capacity and not reasons else 0
    return NodeVerdict(node.metadata.name, not reasons, tuple(reasons), pods)


def gpu_inventory(nodes: Sequence[V1Node]) -> dict[str, list[str]]:
    """GPU-like resource name -> ["node(count)", ...], to suggest what the cluster does offer."""
    seen: dict[str, list[str]] = {}
    for node in nodes:
        for resource, amount in ((node.status.allocatable if node.status else None) or {}).items():
            if resource.startswith(GPU_RESOURCE_PREFIXES) and _quantity(amount) > 0:
                seen.setdefault(resource, []).append(f"{node.metadata.name}({amount})")
    return seen


def check_feasibility(
    gpu: GpuRequest, nodes: Sequence[V1Node], extra: Mapping[str, str] | None = None
) -> list[str]:
    """Return the names of nodes that could hold a pod; raise if all of them together could
    never hold the `gpu.nodes` pods of the request (each also asking for the `extra` resources).

    Each pod takes its GPUs from one node; several pods may share a node with room for them
    (two 4-GPU pods on one 8-GPU node), so the nodes' pod capacities are summed."""
    verdicts = [judge_node(gpu, n, extra) for n in nodes]
    fitting = [v.name for v in verdicts if v.fits]
    if sum(v.pods for v in verdicts) >= gpu.nodes:
        return fitting
    want = f"{gpu.gpus_per_node} x {gpu.resource_name}, " if gpu.gpus_per_node else ""
    want += "".join(f"{count} x {name}, " for name, count in (extra or {}).items())
    lines = [
        f"GPU request can never be scheduled: {gpu.nodes} pod(s) needed, each with "
        f"{want}cpu {gpu.cpu_request}, memory {gpu.memory_request}"
        + (f", nodeSelector {dict(gpu.node_selector)}" if gpu.node_selector else "")
        + (", a required nodeAffinity" if _required_terms(gpu.affinity) else "")
        + f"; {len(fitting)} of {len(nodes)} node(s) qualify"
        + f" with room for {sum(v.pods for v in verdicts)} pod(s)"
        + (f" ({', '.join(fitting)})" if fitting else "")
        + "."
    ]
    for v in verdicts:
        if not v.fits:
            lines.append(f"  {v.name}: " + "; ".join(v.reasons))
    inventory = gpu_inventory(nodes)
    if inventory:
        lines.append(
            "  GPU resources in the cluster: "
            + "; ".join(f"{r} on {', '.join(where)}" for r, where in sorted(inventory.items()))
        )
    else:
        lines.append("  No node advertises GPUs (is the NVIDIA device plugin running?).")
    lines.append(
        "Fix: lower gpu.gpus_per_node / gpu.nodes, pick a resource_name listed above (a MIG "
        "profile such as nvidia.com/mig-1g.10gb for small jobs), add the tolerations for the "
        "GPU nodes' taints, or correct gpu.node_selector / affinity (the pipeline's placement). A pod's cpu and memory grow with its "
        "GPUs: lower the recipe's cpu_per_gpu / memory_gib_per_gpu for smaller nodes."
        + (" The RDMA device comes from the chart's training.rdma settings: check its "
           "resourceName against the nodes' Allocatable, or turn the profile off."
           if extra else "")
    )
    raise InfeasibleGpuRequest("\n".join(lines))


def pending_reason(pod: V1Pod, events: Sequence[CoreV1Event] = ()) -> str:
    """The scheduler's / kubelet's own words for why `pod` has not started."""
    parts: list[str] = []
    for cond in (pod.status.conditions if pod.status else None) or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            parts.append(f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".strip())
    for status in (pod.status.container_statuses if pod.status else None) or []:
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason and waiting.reason != "ContainerCreating":
            parts.append(f"container {status.name} {waiting.reason}: {waiting.message or ''}")
    warnings = [e for e in events if (e.type or "") == "Warning"]
    # Newest last; a handful is enough, the scheduler repeats itself.
    warnings.sort(key=lambda e: e.last_timestamp or e.event_time or datetime.min)
    for e in warnings[-3:]:
        parts.append(f"event {e.reason}: {e.message}")
    if not parts:
        parts.append("no condition or event explains it yet (still pulling the image?)")
    return "; ".join(dict.fromkeys(p.strip() for p in parts))


def terminal_waiting_reason(pod: V1Pod) -> str | None:
    """A waiting reason that will not resolve by itself (bad image name, missing Secret key)."""
    for status in (pod.status.container_statuses if pod.status else None) or []:
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason in TERMINAL_WAITING_REASONS:
            return f"container {status.name} {waiting.reason}: {waiting.message or ''}".strip()
    return None


def pods_not_started(pods: Sequence[V1Pod]) -> list[V1Pod]:
    """Pods still Pending (unscheduled, pulling, or waiting on config)."""
    return [p for p in pods if (p.status.phase if p.status else "Pending") == "Pending"]


def job_outcome(job_status: Any) -> str:
    """'succeeded', 'failed' or 'running' from a V1JobStatus (conditions are authoritative)."""
    for cond in (job_status.conditions if job_status else None) or []:
        if cond.status != "True":
            continue
        if cond.type == "Complete":
            return "succeeded"
        if cond.type == "Failed":
            return "failed"
    return "running"


def failure_summary(job_status: Any, pods: Sequence[V1Pod]) -> str:
    """Why a Job failed: its Failed condition plus each failed container's exit and message."""
    parts = []
    for cond in (job_status.conditions if job_status else None) or []:
        if cond.type == "Failed" and cond.status == "True":
            parts.append(f"Job {cond.reason}: {cond.message}")
    for pod in pods:
        for status in (pod.status.container_statuses if pod.status else None) or []:
            term = status.state.terminated if status.state else None
            if term and term.exit_code:
                message = (term.message or "").strip().splitlines()[-20:]
                parts.append(
                    f"pod {pod.metadata.name} container {status.name} exited {term.exit_code} "
                    f"({term.reason})" + (":\n    " + "\n    ".join(message) if message else "")
                )
    return "\n".join(parts) or "the Job failed without a recorded reason"
