"""Kueue queueing and the bin-packing scheduler profile, end to end without a cluster.

The chart is rendered by the real Helm engine (as test_helm.py does); its Kueue objects are
validated against the CustomResourceDefinitions the Kueue project publishes (vendored under
kueue_crds/, see its README), its Kubernetes objects against the Kubernetes schemas, and the
KubeSchedulerConfiguration against the v1 Go types kube-scheduler decodes it with
(scheduler_config_v1/). The rendered ConfigMap then drives `platform_settings`, and the training Job
built from it must name the LocalQueue, WorkloadPriorityClass and scheduler the chart rendered.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from kubernetes.client import (
    CoreV1EventList,
    V1Job,
    V1JobSpec,
    V1JobStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodList,
    V1PodStatus,
    V1PodTemplateSpec,
)

from resources.k8s.client import TrainingJobClient
from resources.k8s.feasibility import PodStuckPending
from resources.k8s.kueue import (
    PRIORITY_LABEL,
    QUEUE_LABEL,
    KueueSettings,
    KueueSettingsError,
    is_suspended,
    kueue_settings,
    parse_queues,
    queue_labels,
    queued_job,
    scheduler_name,
)
from resources.k8s.manifests import INDEX_ANNOTATION, build_manifests, build_training_job
from resources.k8s.step_config import platform_settings
from resources.launch.base import GpuRequest, TrainingJob
from tests.k8s.helpers import make_job, validate_all

HERE = Path(__file__).resolve().parent
CHART = HERE.parents[1] / "helm" / "model-factory"
CRD_DIR = HERE / "kueue_crds"
SCHEDULER_TYPES = HERE / "scheduler_config_v1"
NAMESPACE = "model-factory"
ON = {"kueue": {"enabled": True}, "binPackingScheduler": {"enabled": True}}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(str(CHART)).render(values or {}, name="mf", namespace=NAMESPACE)
    docs: list[dict[str, Any]] = []
    for path, text in rendered.items():
        if path.endswith((".yaml", ".yml")):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.fixture(scope="module")
def on_docs() -> list[dict[str, Any]]:
    return render(ON)


# -- Kueue's published CRDs as JSON schemas ------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD's structural schema, with unknown fields rejected as `kubectl apply` with server-side
    strict field validation does (the API server would otherwise prune them silently)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _load_crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    validators = {}
    for path in sorted(CRD_DIR.glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schema = _strict(version["schema"]["openAPIV3Schema"])
                cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
                validators[(f"{group}/{version['name']}", kind)] = cls(schema)
    return validators


CRD_VALIDATORS = _load_crd_validators()


def crd_errors(obj: dict[str, Any]) -> list[str]:
    validator = CRD_VALIDATORS.get((obj["apiVersion"], obj["kind"]))
    if validator is None:
        raise AssertionError(f"no vendored Kueue CRD serves {obj['apiVersion']} {obj['kind']}")
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def test_vendored_crds_serve_v1beta1_of_every_kind_the_chart_renders():
    kinds = {k for (api, k) in CRD_VALIDATORS if api == "kueue.x-k8s.io/v1beta1"}
    assert kinds == {"ClusterQueue", "LocalQueue", "ResourceFlavor", "WorkloadPriorityClass"}


@pytest.mark.parametrize(
    "values",
    [
        ON,
        {"kueue": {"enabled": True, "createResourceFlavors": False, "cohort": "",
                   "queueingStrategy": "StrictFIFO",
                   "teams": [{"name": "ml_research", "fairSharingWeight": 2,
                              "quotas": [{"flavor": "h100", "gpus": 16, "gpuBorrowingLimit": None,
                                          "cpu": 160, "memory": "1536Gi"}]}]}},
        {"kueue": {"enabled": True, "resourceFlavors": [
            {"name": "h200", "resourceName": "nvidia.com/gpu",
             "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H200"},
             "nodeTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}],
            "teams": [{"name": "ml", "quotas": [{"flavor": "h200", "gpus": 8, "gpuBorrowingLimit": 0,
                                                 "cpu": "80", "memory": "768Gi"}]}]}},
    ],
    ids=["defaults-on", "one-team-no-cohort", "tainted-flavor"],
)
def test_every_rendered_object_validates(values):
    docs = render(values)
    kueue = [d for d in docs if d["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert kueue and all(d["apiVersion"] == "kueue.x-k8s.io/v1beta1" for d in kueue)
    for obj in kueue:
        assert crd_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])
    # Everything else (the ConfigMaps included) against the Kubernetes schemas.
    others = [d for d in docs if d not in kueue]
    assert validate_all(others) == len(others)


def test_crd_validation_rejects_what_kueue_rejects(on_docs):
    (cq, *_) = by_kind(on_docs, "ClusterQueue")
    typo = copy.deepcopy(cq)
    typo["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuotas"] = "1"
    assert any("nominalQuotas" in e for e in crd_errors(typo))
    bad_strategy = copy.deepcopy(cq)
    bad_strategy["spec"]["queueingStrategy"] = "FIFO"
    assert crd_errors(bad_strategy)
    bad_quota = copy.deepcopy(cq)
    bad_quota["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "ten"
    assert crd_errors(bad_quota)
    (lq, *_) = by_kind(on_docs, "LocalQueue")
    no_queue = copy.deepcopy(lq)
    no_queue["spec"]["clusterQueue"] = "Not_A_Name"
    assert crd_errors(no_queue)


def test_nothing_of_kueue_or_the_scheduler_by_default():
    docs = render()
    assert not [d for d in docs if d["apiVersion"].startswith("kueue.x-k8s.io/")]
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["data"]["MODEL_FACTORY_KUEUE_ENABLED"] == "false"
    assert "MODEL_FACTORY_KUEUE_QUEUES" not in cm["data"]
    assert cm["data"]["MODEL_FACTORY_SCHEDULER_NAME"] == ""
    assert kueue_settings(cm["data"]) is None and scheduler_name(cm["data"]) is None


def test_a_resource_flavor_per_gpu_type_or_mig_profile(on_docs):
    flavors = {d["metadata"]["name"]: d for d in by_kind(on_docs, "ResourceFlavor")}
    assert set(flavors) == {"h100", "mig-1g-10gb"}
    assert flavors["h100"]["spec"]["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    annotations = flavors["mig-1g-10gb"]["metadata"]["annotations"]
    assert annotations["model-factory.io/gpu-resource"] == "nvidia.com/mig-1g.10gb"
    # Referring to flavors that exist already renders no ResourceFlavor but the same queues.
    docs = render({"kueue": {"enabled": True, "createResourceFlavors": False}})
    assert not by_kind(docs, "ResourceFlavor")
    assert len(by_kind(docs, "ClusterQueue")) == 2


def test_a_cluster_queue_per_team_with_gpu_quota_and_borrowing(on_docs):
    queues = {d["metadata"]["name"]: d for d in by_kind(on_docs, "ClusterQueue")}
    assert set(queues) == {"model-factory-ml", "model-factory-vision"}
    spec = queues["model-factory-ml"]["spec"]
    assert spec["cohort"] == "model-factory"
    assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert spec["preemption"] == {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    (group,) = spec["resourceGroups"]
    # Every resource a training pod requests is covered, or Kueue would never admit the Job.
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
    quota = {}
    for flavor in group["flavors"]:
        # Kueue's rule (CEL in the CRD, order checked by its webhook): each flavor lists the
        # covered resources, in the same order.
        assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
        quota[flavor["name"]] = {r["name"]: r for r in flavor["resources"]}
    assert quota["h100"]["nvidia.com/gpu"] == {"name": "nvidia.com/gpu", "nominalQuota": 4, "borrowingLimit": 4}
    assert quota["h100"]["nvidia.com/mig-1g.10gb"] == {"name": "nvidia.com/mig-1g.10gb", "nominalQuota": 0}
    assert quota["mig-1g-10gb"]["nvidia.com/mig-1g.10gb"]["nominalQuota"] == 7
    assert quota["h100"]["cpu"]["nominalQuota"] == "40" and quota["h100"]["memory"]["nominalQuota"] == "384Gi"
    # The teams' nominal GPUs together stay within the namespace's ResourceQuota.
    (rq,) = by_kind(on_docs, "ResourceQuota")
    for resource in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb"):
        total = sum(f["resources"][group["coveredResources"].index(resource)]["nominalQuota"]
                    for q in queues.values() for f in q["spec"]["resourceGroups"][0]["flavors"])
        assert total == int(rq["spec"]["hard"][f"requests.{resource}"])


def test_no_cohort_means_no_borrowing():
    docs = render({"kueue": {"enabled": True, "cohort": "", "teams": [
        {"name": "ml", "quotas": [{"flavor": "h100", "gpus": 8, "cpu": "80", "memory": "768Gi"}]}]}})
    (cq,) = by_kind(docs, "ClusterQueue")
    assert "cohort" not in cq["spec"]
    assert not [r for f in cq["spec"]["resourceGroups"][0]["flavors"] for r in f["resources"] if "borrowingLimit" in r]
    # A team with one flavor covers only that flavor's GPU resource.
    assert cq["spec"]["resourceGroups"][0]["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    with pytest.raises(helm_python.HelmRenderError, match="gpuBorrowingLimit needs kueue.cohort"):
        render({"kueue": {"enabled": True, "cohort": ""}})


def test_chart_names_the_fix_for_a_quota_on_an_unknown_flavor():
    with pytest.raises(helm_python.HelmRenderError, match='flavor "a100", which kueue.resourceFlavors does not list'):
        render({"kueue": {"enabled": True, "teams": [
            {"name": "ml", "quotas": [{"flavor": "a100", "gpus": 8, "cpu": "80", "memory": "768Gi"}]}]}})


@pytest.mark.parametrize(
    "values, where",
    [
        ({"kueue": {"enabled": True, "teams": [{"name": "ML-team", "quotas": []}]}}, "/kueue/teams/0"),
        ({"kueue": {"queueingStrategy": "FIFO"}}, "/kueue/queueingStrategy"),
        ({"kueue": {"resourceFlavors": [{"name": "h100", "resourceName": "gpu"}]}}, "/kueue/resourceFlavors/0"),
        ({"binPackingScheduler": {"resources": [{"name": "nvidia.com/gpu", "weight": 0}]}},
         "/binPackingScheduler/resources/0/weight"),
        ({"binPackingScheduler": {"schedulerName": "Bin_Pack"}}, "/binPackingScheduler/schedulerName"),
    ],
    ids=["team-name", "strategy", "resource-name", "weight", "scheduler-name"],
)
def test_values_schema_rejects_bad_settings(values, where):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render(values)


def test_local_queues_in_the_training_namespace(on_docs):
    local = {d["metadata"]["name"]: d for d in by_kind(on_docs, "LocalQueue")}
    cluster = {d["metadata"]["name"] for d in by_kind(on_docs, "ClusterQueue")}
    assert set(local) == cluster
    for name, lq in local.items():
        assert lq["metadata"]["namespace"] == NAMESPACE
        assert lq["spec"]["clusterQueue"] == name


def test_workload_priority_classes_match_the_platform_priorities(on_docs):
    pcs = {d["metadata"]["name"]: d["value"] for d in by_kind(on_docs, "PriorityClass")}
    wpcs = {d["metadata"]["name"]: d["value"] for d in by_kind(on_docs, "WorkloadPriorityClass")}
    assert wpcs == pcs == {"model-factory-training": 100000, "model-factory-adhoc": 10000}
    renamed = render({"kueue": {"enabled": True},
                      "priorityClasses": {"training": {"name": "prod-train", "value": 5000}}})
    assert {d["metadata"]["name"]: d["value"] for d in by_kind(renamed, "WorkloadPriorityClass")} == {
        "prod-train": 5000, "model-factory-adhoc": 10000}


# -- one configuration path: chart -> ConfigMap -> platform_settings -> the training Job ---------


def _job(team: str | None = "ml", priority: str | None = None, nnodes: int = 2) -> TrainingJob:
    base = make_job(nnodes=nnodes, nproc=8)
    return TrainingJob(name=base.name, config=base.config, nproc_per_node=8, nnodes=nnodes, team=team,
                       gpu=GpuRequest(nodes=nnodes, gpus_per_node=8, priority_class=priority))


def test_rendered_chart_settings_reach_the_training_job(on_docs):
    (cm,) = [d for d in by_kind(on_docs, "ConfigMap") if d["metadata"]["name"] == "model-factory-platform"]
    settings = platform_settings(cm["data"])
    assert settings.kueue is not None
    lqs = {d["metadata"]["name"] for d in by_kind(on_docs, "LocalQueue")}
    wpcs = {d["metadata"]["name"] for d in by_kind(on_docs, "WorkloadPriorityClass")}
    (sched_cm,) = [d for d in by_kind(on_docs, "ConfigMap") if d is not cm]
    profile_names = {p["schedulerName"] for p in yaml.safe_load(sched_cm["data"]["scheduler-config.yaml"])["profiles"]}

    for team, queue in (("ml", "model-factory-ml"), ("vision", "model-factory-vision")):
        manifests = build_manifests(_job(team, "model-factory-training"), settings)
        assert validate_all(manifests) == 2
        job = manifests[0]
        labels = job["metadata"]["labels"]
        assert labels[QUEUE_LABEL] == queue and queue in lqs
        assert labels[PRIORITY_LABEL] == "model-factory-training" and labels[PRIORITY_LABEL] in wpcs
        assert job["spec"]["suspend"] is True
        # Kueue admits the whole gang: every pod of the Indexed Job is one pod set.
        assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
        assert job["spec"]["template"]["spec"]["schedulerName"] in profile_names
    # No priority class: ad-hoc work, the lower class.
    adhoc = build_training_job(_job("ml", None), settings)
    assert adhoc["metadata"]["labels"][PRIORITY_LABEL] == "model-factory-adhoc" in wpcs


def test_the_training_launcher_carries_the_chart_settings(on_docs):
    from resources.k8s.launcher import KubernetesTrainingLauncher, launcher_kwargs

    (cm,) = [d for d in by_kind(on_docs, "ConfigMap") if d["metadata"]["name"] == "model-factory-platform"]
    chart = platform_settings(cm["data"])
    # Both ways the orchestrator builds the launcher keep the queueing and the scheduler.
    assert KubernetesTrainingLauncher(**launcher_kwargs(chart)).pod_settings() == chart
    launcher = KubernetesTrainingLauncher.from_settings(
        namespace=NAMESPACE, image="img:1", work_root="/mnt/training", environ=cm["data"])
    settings = launcher.pod_settings()
    assert settings.kueue == chart.kueue and settings.scheduler_name == "model-factory-binpack"
    job = build_training_job(_job("vision"), settings)
    assert job["metadata"]["labels"][QUEUE_LABEL] == "model-factory-vision" and job["spec"]["suspend"]


def test_without_kueue_the_job_starts_at_once(settings):
    job = build_training_job(_job(), settings)
    assert "suspend" not in job["spec"]
    assert QUEUE_LABEL not in job["metadata"]["labels"]
    assert "schedulerName" not in job["spec"]["template"]["spec"]


def _kueue() -> KueueSettings:
    return KueueSettings(queues={"ml": "model-factory-ml"}, training_priority_class="model-factory-training",
                         adhoc_priority_class="model-factory-adhoc")


def test_queue_labels_name_the_fix():
    with pytest.raises(KueueSettingsError, match="TrainingJob.team is not set"):
        queue_labels(None, None, _kueue())
    with pytest.raises(KueueSettingsError, match=r"team 'nlp' has no Kueue LocalQueue.*kueue.teams"):
        queue_labels("nlp", None, _kueue())
    # A pipeline's own PriorityClass has no WorkloadPriorityClass: Kueue reads the pod's instead.
    assert queue_labels("ml", "urgent", _kueue()) == {QUEUE_LABEL: "model-factory-ml"}
    assert queue_labels("ml", None, _kueue()) == {
        QUEUE_LABEL: "model-factory-ml", PRIORITY_LABEL: "model-factory-adhoc"}


def test_queued_job_leaves_the_built_job_alone():
    manifest = {"metadata": {"name": "j", "labels": {"a": "b"}}, "spec": {"parallelism": 1}}
    queued = queued_job(manifest, {QUEUE_LABEL: "q"})
    assert queued["spec"] == {"parallelism": 1, "suspend": True}
    assert queued["metadata"]["labels"] == {"a": "b", QUEUE_LABEL: "q"}
    assert manifest == {"metadata": {"name": "j", "labels": {"a": "b"}}, "spec": {"parallelism": 1}}


def test_settings_round_trip_and_reject_bad_keys():
    assert kueue_settings(_kueue().to_environ()) == _kueue()
    assert kueue_settings({}) is None and kueue_settings({"MODEL_FACTORY_KUEUE_ENABLED": "false"}) is None
    with pytest.raises(KueueSettingsError, match="kueue.enabled .* 'maybe'"):
        kueue_settings({"MODEL_FACTORY_KUEUE_ENABLED": "maybe"})
    with pytest.raises(KueueSettingsError, match="MODEL_FACTORY_KUEUE_QUEUES not set"):
        kueue_settings({**_kueue().to_environ(), "MODEL_FACTORY_KUEUE_QUEUES": ""})
    with pytest.raises(KueueSettingsError, match="'ml' is not 'team=localqueue'"):
        parse_queues("ml")
    with pytest.raises(KueueSettingsError, match="names team 'ml' twice"):
        parse_queues("ml=a,ml=b")
    with pytest.raises(KueueSettingsError, match="must be a DNS label"):
        KueueSettings(queues={"ml": "Queue_1"}, training_priority_class="t", adhoc_priority_class="a")
    with pytest.raises(KueueSettingsError, match="not a platform team name"):
        KueueSettings(queues={"ML": "q"}, training_priority_class="t", adhoc_priority_class="a")
    with pytest.raises(KueueSettingsError, match="binPackingScheduler.schedulerName"):
        scheduler_name({"MODEL_FACTORY_SCHEDULER_NAME": "Bin Pack"})


# -- the launcher's watch while the Job waits in its queue ---------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class QueuedCluster:
    """Batch and core API stand-ins for one Job that Kueue admits at `admit_at` (clock seconds);
    its pods reach `phase` then (no pods exist while the Job is suspended)."""

    def __init__(self, clock: FakeClock, admit_at: float, nodes: int, phase: str = "Running"):
        self.clock, self.admit_at, self.nodes, self.phase = clock, admit_at, nodes, phase

    def admitted(self) -> bool:
        return self.clock() >= self.admit_at

    def read_namespaced_job_status(self, name: str, namespace: str) -> V1Job:
        spec = V1JobSpec(template=V1PodTemplateSpec(), suspend=not self.admitted())
        return V1Job(metadata=V1ObjectMeta(name=name), spec=spec, status=V1JobStatus())

    def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> V1PodList:
        if not self.admitted():
            return V1PodList(items=[])
        return V1PodList(items=[
            V1Pod(metadata=V1ObjectMeta(name=f"job-{i}", annotations={INDEX_ANNOTATION: str(i)}),
                  status=V1PodStatus(phase=self.phase))
            for i in range(self.nodes)
        ])

    def list_namespaced_event(self, namespace: str, field_selector: str = "") -> CoreV1EventList:
        return CoreV1EventList(items=[])


def _client(cluster: QueuedCluster, clock: FakeClock) -> TrainingJobClient:
    return TrainingJobClient(cluster, cluster, poll_interval_s=30, pending_timeout_s=600,
                             clock=clock, sleep=clock.sleep)


def test_a_job_waiting_in_its_queue_does_not_time_out():
    clock = FakeClock()
    # Admitted after three hours in the queue, far past the 10-minute Pending timeout.
    cluster = QueuedCluster(clock, admit_at=3 * 3600, nodes=2)
    pods = _client(cluster, clock).wait_started("job", NAMESPACE, 2)
    assert [p.metadata.name for p in pods] == ["job-0", "job-1"]
    assert clock() >= 3 * 3600


def test_the_pending_timeout_counts_from_admission():
    clock = FakeClock()
    cluster = QueuedCluster(clock, admit_at=3600, nodes=2, phase="Pending")
    with pytest.raises(PodStuckPending, match="still has pods Pending after 600s"):
        _client(cluster, clock).wait_started("job", NAMESPACE, 2)
    # The last poll that saw the Job suspended starts the 600 s (polls are 30 s apart): never
    # counted from the Job's creation, which would have failed it while it waited in the queue.
    assert 3600 - 30 + 600 <= clock() <= 3600 + 600 + 30


def test_is_suspended_reads_the_job_spec():
    assert is_suspended(V1Job(spec=V1JobSpec(template=V1PodTemplateSpec(), suspend=True)))
    assert not is_suspended(V1Job(spec=V1JobSpec(template=V1PodTemplateSpec(), suspend=False)))
    assert not is_suspended(V1Job(status=V1JobStatus()))


# -- the bin-packing scheduler profile against kube-scheduler's v1 Go types ----------------------

_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.S | re.M)
_FIELD = re.compile(r"^\t(?:(\w+)\s+)?([\w.*\[\]]+)\s+`json:\"([^\"]*)\"`", re.M)
_CONST = re.compile(r"^\t(\w+)\s+(\w+)\s*=\s*\"([^\"]*)\"", re.M)
_PRIMITIVES = {"string": str, "bool": bool, "int32": int, "int64": int, "float32": (int, float)}


def _go_types() -> tuple[dict[str, dict[str, tuple[str, bool]]], dict[str, set[str]]]:
    """JSON field name -> (Go type, is list) per struct, and the string constants of each named
    type, from the vendored kube-scheduler and component-base sources."""
    structs: dict[str, dict[str, tuple[str, bool]]] = {
        "TypeMeta": {"apiVersion": ("string", False), "kind": ("string", False)},
    }
    inline: dict[str, list[str]] = {}
    enums: dict[str, set[str]] = {}
    for path in sorted(SCHEDULER_TYPES.glob("*.go")):
        text = path.read_text()
        for name, body in _STRUCT.findall(text):
            fields, embedded = {}, []
            for _, go_type, tag in _FIELD.findall(body):
                json_name = tag.split(",")[0]
                base = go_type.lstrip("*[]").split(".")[-1]
                if not json_name and "inline" in tag:
                    embedded.append(base)
                elif json_name:
                    fields[json_name] = (base, go_type.lstrip("*").startswith("[]"))
            structs[name], inline[name] = fields, embedded
        for _, type_name, value in _CONST.findall(text):
            enums.setdefault(type_name, set()).add(value)
    for name, embedded in inline.items():
        for base in embedded:
            structs[name].update(structs[base])
    return structs, enums


STRUCTS, ENUMS = _go_types()


def scheduler_config_problems(value: Any, go_type: str = "KubeSchedulerConfiguration", path: str = "") -> list[str]:
    if go_type == "RawExtension":  # plugin args: typed by the plugin's name (pluginConfig below)
        return []
    if go_type in STRUCTS:
        if not isinstance(value, dict):
            return [f"{path or '/'}: {go_type} must be a mapping"]
        problems = []
        for key, item in value.items():
            if key not in STRUCTS[go_type]:
                problems.append(f"{path}/{key}: no such field in {go_type}")
                continue
            field_type, is_list = STRUCTS[go_type][key]
            items = item if is_list else [item]
            if is_list and not isinstance(item, list):
                problems.append(f"{path}/{key}: must be a list")
                continue
            for i, element in enumerate(items):
                where = f"{path}/{key}" + (f"/{i}" if is_list else "")
                problems += scheduler_config_problems(element, field_type, where)
        if go_type == "PluginConfig" and "args" in value:
            args_type = f"{value.get('name')}Args"
            if args_type not in STRUCTS:
                problems.append(f"{path}/args: plugin {value.get('name')!r} takes no typed args")
            else:
                problems += scheduler_config_problems(value["args"], args_type, f"{path}/args")
        return problems
    if go_type in ENUMS and value not in ENUMS[go_type]:
        return [f"{path}: {value!r} is not one of {sorted(ENUMS[go_type])}"]
    expected = _PRIMITIVES.get(go_type)
    if expected is not None and not isinstance(value, expected):
        return [f"{path}: {value!r} is not a {go_type}"]
    return []


def test_the_parse_check_knows_the_documented_fields():
    fields = set(STRUCTS["KubeSchedulerConfiguration"])
    assert {"profiles", "leaderElection", "apiVersion", "kind", "parallelism"} <= fields
    assert {"LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"} == ENUMS["ScoringStrategyType"]
    assert scheduler_config_problems({"profiles": [{"schedulerName": "x", "pluginConfig": [
        {"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "MostAlocated"}}}]}]})
    assert scheduler_config_problems({"leaderElection": {"leaderElect": False, "leaseDurations": "15s"}})


def test_bin_packing_profile_scores_most_allocated_on_gpus(on_docs):
    (cm,) = [d for d in by_kind(on_docs, "ConfigMap") if d["metadata"]["name"] == "model-factory-binpack-scheduler"]
    config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert scheduler_config_problems(config) == []
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "model-factory-binpack"
    (plugin,) = profile["pluginConfig"]
    assert plugin["name"] == "NodeResourcesFit"
    strategy = plugin["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights["nvidia.com/gpu"] > max(w for n, w in weights.items() if n != "nvidia.com/gpu")
    # Its own lease: a second scheduler must not contend for the default scheduler's.
    assert config["leaderElection"] == {"leaderElect": False}
