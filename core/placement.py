"""Where a pipeline's training pods run on Kubernetes: node selector, tolerations, affinity, priority
class and fixed pod sizes. Validated when definitions load (``placement_problems``), carried to the
pod through ``GpuRequest`` (ops/training_config.py) and applied by resources/k8s/manifests.py.

The local launcher ignores placement: it only means something to a cluster's scheduler.

Priority: a pipeline that names no ``priority_class`` gets the chart's higher PriorityClass when a
schedule or sensor started the run and the lower one otherwise, so ad-hoc experiments never preempt
retraining (resources/k8s/manifests.py ``with_run_priority`` decides from the run's tags).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

# Label keys: an optional DNS-subdomain prefix and a name; values: empty or the name's syntax.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# An extended resource name as a device plugin advertises it: <domain>/<name>.
_RESOURCE_NAME = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# The NVIDIA device plugin's MIG names (mixed strategy): nvidia.com/mig-<g>g.<mem>gb, optionally a
# compute-instance prefix (mig-1c.3g.40gb) and a suffix such as ".me" (media extensions).
MIG_PREFIX = "nvidia.com/mig-"
_MIG_PROFILE = re.compile(r"^([0-9]+c\.)?[0-9]+g\.[0-9]+gb(\.[a-z]+)*$")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Scheduling settings of one pipeline's training pods (Kubernetes field names and shapes)."""

    # Node labels every training pod's node must carry, e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}.
    node_selector: dict[str, str] = field(default_factory=dict)
    # Pod tolerations, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}].
    tolerations: tuple[dict[str, Any], ...] = ()
    # A pod `affinity` (nodeAffinity, podAffinity, podAntiAffinity) as in a pod spec; None: none.
    affinity: dict[str, Any] | None = None
    # A PriorityClass name; None: the chart's training class for scheduled and new-data runs, its
    # ad-hoc class for runs started by hand.
    priority_class: str | None = None
    # Fixed pod sizes (Kubernetes quantities) instead of the recipe's per-GPU ones; the way a CPU-only
    # pod (gpus_per_node=0) sets its own size. memory is the request and the limit; shm sizes /dev/shm.
    cpu: str | None = None
    memory: str | None = None
    shm: str | None = None

    def __post_init__(self) -> None:
        # YAML and plain dicts give lists; the frozen spec keeps tuples so it stays hashable-ish and
        # comparable. Shapes are checked by placement_problems, which names the pipeline.
        if isinstance(self.tolerations, list):
            object.__setattr__(self, "tolerations", tuple(self.tolerations))


def _label_key_problem(key: Any) -> str | None:
    if not isinstance(key, str) or not key:
        return f"{key!r} is not a label key"
    prefix, slash, name = key.rpartition("/")
    if (slash and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name):
        return (f"{key!r} is not a label key: an optional DNS prefix and '/', then up to 63 letters, digits, "
                "'-', '_' or '.', starting and ending with a letter or digit")
    return None


def _label_value_problem(value: Any) -> str | None:
    if not isinstance(value, str) or (value and not _LABEL_NAME.match(value)):
        return (f"{value!r} is not a label value: a string of up to 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit (or empty)")
    return None


def _toleration_problem(t: Any) -> str | None:
    if not isinstance(t, Mapping):
        return f"{t!r} is not a toleration; give a mapping with key, operator, value, effect"
    unknown = [k for k in t if k not in TOLERATION_KEYS]
    if unknown:
        return f"{unknown[0]!r} is not a toleration field; use {list(TOLERATION_KEYS)}"
    op = t.get("operator", "Equal")
    if op not in TOLERATION_OPERATORS:
        return f"operator {op!r}: use one of {list(TOLERATION_OPERATORS)}"
    key = t.get("key") or ""
    if key and _label_key_problem(key):
        return f"key {_label_key_problem(key)}"
    if not key and op != "Exists":
        return "an empty key tolerates every taint only with operator 'Exists'"
    if op == "Exists" and t.get("value"):
        return "operator 'Exists' takes no value; leave value out or use 'Equal'"
    if op == "Equal" and _label_value_problem(t.get("value") or ""):
        return f"value {_label_value_problem(t.get('value'))}"
    effect = t.get("effect") or ""
    if effect and effect not in TAINT_EFFECTS:
        return f"effect {effect!r}: use one of {list(TAINT_EFFECTS)} (or leave it out for all)"
    if "tolerationSeconds" in t:
        seconds = t["tolerationSeconds"]
        if effect != "NoExecute":
            return "tolerationSeconds applies to effect 'NoExecute' only"
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            return f"tolerationSeconds {seconds!r} must be a whole number of seconds"
    return None


def _model_problem(value: Any, type_name: str, path: str) -> str | None:
    """`value` checked against the kubernetes client's model `type_name` (its OpenAPI field map):
    every key must be a field, every field the right shape, and required fields present."""
    from kubernetes import client as k8s

    if type_name.startswith("list["):
        if not isinstance(value, list):
            return f"{path}: expected a list, got {value!r}"
        inner = type_name[5:-1]
        for i, item in enumerate(value):
            if problem := _model_problem(item, inner, f"{path}[{i}]"):
                return problem
        return None
    if type_name.startswith(("dict(", "dict[")):
        ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return None if ok else f"{path}: expected a mapping of strings, got {value!r}"
    if type_name in ("str", "int", "bool"):
        kind = {"str": str, "int": int, "bool": bool}[type_name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{path}: expected {type_name}, got {value!r}"
        return None
    model = getattr(k8s, type_name, None)
    if model is None:  # a scalar the pod fields here do not use (object, float, datetime)
        return None
    if not isinstance(value, Mapping):
        return f"{path}: expected a mapping ({type_name}), got {value!r}"
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            return f"{path}.{key}: not a field of {type_name}; the fields are {sorted(by_json)}"
        if problem := _model_problem(item, model.openapi_types[by_json[key]], f"{path}.{key}"):
            return problem
    try:  # the client's own required-field checks (e.g. a node selector term's key)
        model(**{by_json[k]: v for k, v in value.items()})
    except ValueError as exc:
        return f"{path}: {exc}"
    return None


def _affinity_problem(affinity: Any) -> str | None:
    if affinity is None:
        return None
    if problem := _model_problem(affinity, "V1Affinity", "affinity"):
        return problem
    node = affinity.get("nodeAffinity") or {}
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms", [])
    preferred = [p.get("preference") or {} for p in node.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    for term in [*required, *preferred]:
        for req in [*term.get("matchExpressions", []), *term.get("matchFields", [])]:
            op, values = req.get("operator"), req.get("values") or []
            if op not in NODE_SELECTOR_OPERATORS:
                return f"nodeAffinity operator {op!r}: use one of {list(NODE_SELECTOR_OPERATORS)}"
            if op in ("In", "NotIn") and not values:
                return f"nodeAffinity operator {op!r} on {req.get('key')!r} needs values"
            if op in ("Exists", "DoesNotExist") and values:
                return f"nodeAffinity operator {op!r} on {req.get('key')!r} takes no values"
            if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", str(values[0]))):
                return f"nodeAffinity operator {op!r} on {req.get('key')!r} takes exactly one whole number"
    return None


def placement_problems(placement: Placement, *, gpus_per_node: int, gpu_resource_name: str,
                       cpu_per_gpu: float, memory_gib_per_gpu: float,
                       shm_gib_per_gpu: float) -> list[tuple[str, str]]:
    """(field, problem) for each placement or GPU setting that cannot make a schedulable pod; the
    fields are named as a pipeline declares them (placement.*, recipe.gpu_resource_name)."""
    from resources.launch.base import GpuRequest, is_quantity, parse_quantity  # the pod's sizing rules live there

    p = placement
    problems: list[tuple[str, str]] = []
    if not isinstance(p.node_selector, Mapping):
        problems.append(("placement.node_selector", f"{p.node_selector!r} is not a mapping of label to value"))
    else:
        for key, value in p.node_selector.items():
            if problem := _label_key_problem(key) or _label_value_problem(value):
                problems.append((f"placement.node_selector.{key}", problem))
    for i, t in enumerate(p.tolerations):
        if problem := _toleration_problem(t):
            problems.append((f"placement.tolerations[{i}]", problem))
    if problem := _affinity_problem(p.affinity):
        problems.append(("placement.affinity", problem))
    if p.priority_class is not None:
        if not isinstance(p.priority_class, str) or not _DNS_SUBDOMAIN.match(p.priority_class):
            problems.append(("placement.priority_class", f"{p.priority_class!r} is not a PriorityClass name "
                             "(lowercase letters, digits, '-' and '.'); leave it out to take the chart's "
                             "class by run origin"))
        elif p.priority_class.startswith("system-"):
            problems.append(("placement.priority_class", f"{p.priority_class!r}: 'system-' classes are "
                             "reserved for cluster components; use the chart's model-factory-training or "
                             "model-factory-adhoc, or leave it out"))
    sizes_ok = True
    for name in ("cpu", "memory", "shm"):
        value = getattr(p, name)
        if value is not None and not is_quantity(value):
            sizes_ok = False
            problems.append((f"placement.{name}", f"{value!r} is not a Kubernetes quantity such as '8', '500m' or "
                             "'64Gi'; leave it out to size the pod per GPU from the recipe"))
    if sizes_ok:
        gpu = GpuRequest(gpus_per_node=max(gpus_per_node, 0), cpu_per_gpu=cpu_per_gpu,
                         memory_gib_per_gpu=memory_gib_per_gpu, shm_gib_per_gpu=shm_gib_per_gpu,
                         cpu=p.cpu, memory=p.memory, shm_size=p.shm)
        if parse_quantity(gpu.shm_limit) >= parse_quantity(gpu.memory_request):
            problems.append(("placement.shm" if p.shm else "placement.memory",
                             f"/dev/shm {gpu.shm_limit} must stay below the pod's memory {gpu.memory_request}: "
                             "it is memory-backed and counts against the memory limit"))
        if p.cpu is not None and parse_quantity(p.cpu) <= 0:
            problems.append(("placement.cpu", f"{p.cpu!r} must be more than zero"))
    name = gpu_resource_name
    if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
        problems.append(("recipe.gpu_resource_name", f"{name!r} is not an extended resource name such as "
                         "'nvidia.com/gpu' or a MIG profile 'nvidia.com/mig-1g.10gb'"))
    elif name.startswith(MIG_PREFIX):
        if not _MIG_PROFILE.match(name[len(MIG_PREFIX):]):
            problems.append(("recipe.gpu_resource_name", f"{name!r} is not a MIG profile; the NVIDIA device "
                             "plugin names them like 'nvidia.com/mig-1g.10gb' or 'nvidia.com/mig-3g.40gb' "
                             "(kubectl describe node lists them under Allocatable)"))
        elif gpus_per_node > 1:
            problems.append(("recipe.gpus_per_node", f"{gpus_per_node} MIG slices per pod: CUDA shows a process one "
                             "MIG device, so the ranks of one pod cannot each take a slice; use gpus_per_node=1 "
                             "or whole GPUs ('nvidia.com/gpu')"))
    if gpus_per_node == 0 and name != "nvidia.com/gpu":
        problems.append(("recipe.gpu_resource_name", f"{name!r} is set but gpus_per_node is 0 (a CPU-only pod "
                         "requests no GPU); set gpus_per_node or leave gpu_resource_name out"))
    return problems
