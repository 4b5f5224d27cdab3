"""Placement per pipeline: node selector, tolerations, affinity, priority class, CPU/memory/shm and
GPU resource (or MIG profile), validated when definitions load, carried through training_job() to
the Job the launcher builds (valid for Kubernetes 1.31), and taken into account by the
feasibility check."""

from __future__ import annotations

import re

import pytest

from core.placement import Placement
from core.spec import PipelineDefinitionError, model_pipeline
from ops.training_config import training_job
from resources.k8s.feasibility import InfeasibleGpuRequest, check_feasibility
from resources.k8s.manifests import build_training_job, is_automated_run, with_run_priority
from resources.k8s.step_config import step_k8s_config
from tests.k8s.helpers import GPU_TAINT, GPU_TOLERATION, h100, node, validate_all
from tests.k8s.test_step_config import _step_job_from_asset_tags

CONFIG = {"output_dir": "/mnt/training/iris/out", "checkpoint": {"dir": "/mnt/training/iris/ckpt"}}
H100_ONLY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100", "H200"]}]}]}}}
SPREAD = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "x"}}}}]}}


def spec(placement=None, **recipe):
    return model_pipeline("iris", source="iris/*.csv", features=["a", "b"], label="y", classes=["p", "q"],
                          recipe={"gpus_per_node": 8, **recipe}, placement=placement)


def pod_of(s, tags=None, settings=None):
    from tests.k8s.helpers import pod_settings
    import dataclasses

    settings = settings or dataclasses.replace(pod_settings(), training_priority_class="model-factory-training",
                                               adhoc_priority_class="model-factory-adhoc")
    job = with_run_priority(training_job(s, "0123456789abcdef", CONFIG), settings, tags or {})
    manifest = build_training_job(job, settings)
    assert validate_all([manifest]) == 1
    return manifest["spec"]["template"]["spec"]


def test_placement_reaches_the_training_pod():
    s = spec({"node_selector": {"nvidia.com/gpu.product": "H100"}, "tolerations": [GPU_TOLERATION],
              "affinity": {**H100_ONLY, **SPREAD}, "priority_class": "team-a-critical"})
    pod = pod_of(s)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [GPU_TOLERATION]
    assert pod["affinity"] == {**H100_ONLY, **SPREAD}
    # The pipeline's own class wins over the chart's class by origin.
    assert pod["priorityClassName"] == "team-a-critical"


@pytest.mark.parametrize("tags, priority", [
    ({"dagster/schedule_name": "iris_retrain_schedule"}, "model-factory-training"),
    ({"dagster/sensor_name": "iris_new_data_sensor"}, "model-factory-training"),
    ({"platform/trigger": "new_data"}, "model-factory-training"),
    ({"platform/trigger": "ad_hoc"}, "model-factory-adhoc"),
    ({}, "model-factory-adhoc"),
])
def test_priority_class_follows_the_runs_origin(tags, priority):
    assert is_automated_run(tags) == (priority == "model-factory-training")
    assert pod_of(spec(), tags)["priorityClassName"] == priority


def test_no_chart_classes_no_priority_class():
    from tests.k8s.helpers import pod_settings

    assert "priorityClassName" not in pod_of(spec(), {"dagster/schedule_name": "s"}, settings=pod_settings())


def test_fixed_sizes_size_a_cpu_only_pod():
    # Without GPUs the per-GPU sizes scale to nothing and the floor (2 CPUs, 8 GiB) applies; a
    # CPU-only pipeline sets its pod's size in its placement.
    floor = pod_of(spec(gpus_per_node=0))["containers"][0]["resources"]
    assert floor["requests"] == {"cpu": "2", "memory": "8Gi"}
    pod = pod_of(spec({"cpu": "6", "memory": "24Gi", "shm": "4Gi"}, gpus_per_node=0, world_size=3))
    (container,) = pod["containers"]
    assert container["resources"] == {"requests": {"cpu": "6", "memory": "24Gi"}, "limits": {"memory": "24Gi"}}
    assert container["command"][:2] == ["torchrun", "--nproc-per-node=3"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["sizeLimit"] == "4Gi"


def test_a_mig_profile_is_the_pods_gpu_resource():
    pod = pod_of(spec(gpus_per_node=1, gpu_resource_name="nvidia.com/mig-1g.10gb", cpu_per_gpu=2,
                      memory_gib_per_gpu=12, shm_gib_per_gpu=1))
    assert pod["containers"][0]["resources"]["limits"] == {"memory": "12Gi", "nvidia.com/mig-1g.10gb": "1"}


@pytest.mark.parametrize("placement, recipe, field, says", [
    ({"node_selector": {"gpu type": "h100"}}, {}, "placement.node_selector.gpu type", "is not a label key"),
    ({"node_selector": {"gpu": "H100 SXM"}}, {}, "placement.node_selector.gpu", "is not a label value"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Matches"}]}, {}, "placement.tolerations[0]",
     "operator 'Matches'"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}]}, {},
     "placement.tolerations[0]", "takes no value"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, {}, "placement.tolerations[0]", "empty key"),
    ({"tolerations": [{"key": "a", "effect": "NoRun"}]}, {}, "placement.tolerations[0]", "effect 'NoRun'"),
    ({"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 30}]}, {},
     "placement.tolerations[0]", "tolerationSeconds applies to effect 'NoExecute' only"),
    ({"tolerations": [{"key": "a", "efect": "NoSchedule"}]}, {}, "placement.tolerations[0]",
     "'efect' is not a toleration field"),
    ({"affinity": {"nodeAfinity": {}}}, {}, "placement.affinity", "affinity.nodeAfinity: not a field of V1Affinity"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}]}}}}, {},
     "placement.affinity", "operator 'Near'"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}}, {}, "placement.affinity", "needs values"),
    ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"weight": 3}]}}}, {},
     "placement.affinity", "weight: not a field of V1PodAffinityTerm"),
    ({"priority_class": "High_Priority"}, {}, "placement.priority_class", "is not a PriorityClass name"),
    ({"priority_class": "system-node-critical"}, {}, "placement.priority_class", "reserved"),
    ({"cpu": "four"}, {}, "placement.cpu", "is not a Kubernetes quantity"),
    ({"memory": "16Gi", "shm": "16Gi"}, {}, "placement.shm", "must stay below the pod's memory 16Gi"),
    ({"memory": "4Gi"}, {}, "placement.memory", "/dev/shm 32Gi must stay below the pod's memory 4Gi"),
    ({}, {"gpu_resource_name": "nvidia.com/mig-big"}, "recipe.gpu_resource_name", "is not a MIG profile"),
    ({}, {"gpu_resource_name": "gpu"}, "recipe.gpu_resource_name", "is not an extended resource name"),
    ({}, {"gpu_resource_name": "nvidia.com/mig-1g.10gb", "gpus_per_node": 2, "memory_gib_per_gpu": 12},
     "recipe.gpus_per_node", "CUDA shows a process one MIG device"),
    ({}, {"gpu_resource_name": "nvidia.com/mig-1g.10gb", "gpus_per_node": 0}, "recipe.gpu_resource_name",
     "gpus_per_node is 0"),
])
def test_bad_placement_fails_when_definitions_load(placement, recipe, field, says):
    with pytest.raises(PipelineDefinitionError, match=re.escape(f"pipeline 'iris', field '{field}': ") + ".*"
                       + re.escape(says)):
        spec(placement, **recipe)


def test_a_placement_key_that_does_not_exist_names_the_fields():
    with pytest.raises(PipelineDefinitionError, match=r"field 'placement'.*node_selector"):
        spec({"nodeSelector": {"a": "b"}})


def test_step_pods_that_hold_gpus_take_the_same_affinity():
    job = _step_job_from_asset_tags(step_k8s_config("gpu", training_job(
        spec({"affinity": H100_ONLY, "tolerations": [GPU_TOLERATION]}, gpus_per_node=1), "r", CONFIG).gpu))
    assert validate_all([job]) == 1
    assert job["spec"]["template"]["spec"]["affinity"] == H100_ONLY


# --- feasibility --------------------------------------------------------------------------------

CLUSTER = [
    h100("h100-a"),
    node("h200-a", labels={"nvidia.com/gpu.product": "H200", "zone": "b", "gpu-count": "8"}, taints=[GPU_TAINT],
         cpu="96", memory="1900Gi", **{"nvidia.com__gpu": "8"}),
    node("a100-a", labels={"nvidia.com/gpu.product": "A100"}, cpu="96", memory="1900Gi", **{"nvidia.com__gpu": "8"}),
]


def gpu_of(placement, **recipe):
    return training_job(spec(placement, **recipe), "r", CONFIG).gpu


def test_feasibility_honours_the_placements_required_affinity_and_tolerations():
    assert check_feasibility(gpu_of({"affinity": H100_ONLY, "tolerations": [GPU_TOLERATION]}), CLUSTER) == [
        "h100-a", "h200-a"]
    # Preferred terms and pod (anti-)affinity never rule a node out.
    assert check_feasibility(gpu_of({"affinity": SPREAD, "tolerations": [GPU_TOLERATION]}), CLUSTER) == [
        "h100-a", "h200-a", "a100-a"]
    # Without the toleration, only the untainted A100 node is left, and the affinity rules it out.
    with pytest.raises(InfeasibleGpuRequest) as raised:
        check_feasibility(gpu_of({"affinity": H100_ONLY}), CLUSTER)
    message = str(raised.value)
    assert "a required nodeAffinity" in message
    assert "h100-a: taint nvidia.com/gpu=present:NoSchedule not tolerated" in message
    assert "a100-a: required nodeAffinity not met (term 0: nvidia.com/gpu.product In ['H100', 'H200'])" in message


@pytest.mark.parametrize("expressions, fits", [
    ([{"key": "zone", "operator": "NotIn", "values": ["b"]}], ["h100-a"]),
    ([{"key": "zone", "operator": "Exists"}], ["h200-a"]),
    ([{"key": "zone", "operator": "DoesNotExist"}], ["h100-a"]),
    ([{"key": "gpu-count", "operator": "Gt", "values": ["4"]}], ["h200-a"]),
    ([{"key": "gpu-count", "operator": "Lt", "values": ["4"]}], []),
])
def test_each_node_affinity_operator_is_judged_as_the_scheduler_does(expressions, fits):
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}
    gpu = gpu_of({"affinity": affinity, "tolerations": [GPU_TOLERATION],
                  "node_selector": {}}, gpus_per_node=8)
    nodes = CLUSTER[:2]
    if fits:
        assert check_feasibility(gpu, nodes) == fits
    else:
        with pytest.raises(InfeasibleGpuRequest, match="gpu-count Lt"):
            check_feasibility(gpu, nodes)


def test_match_fields_pick_nodes_by_name_and_terms_are_ored():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a100-a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
    assert check_feasibility(gpu_of({"affinity": affinity, "tolerations": [GPU_TOLERATION]}), CLUSTER) == [
        "h200-a", "a100-a"]


def test_placement_is_a_plain_frozen_value():
    p = Placement(tolerations=[GPU_TOLERATION])
    assert p.tolerations == (GPU_TOLERATION,)
    with pytest.raises(Exception):
        p.cpu = "2"  # type: ignore[misc]


# --- YAML blocks ------------------------------------------------------------------------------------

from tests.pipeline.test_components import FLOWERS, DefsModule, training_block  # noqa: E402


@pytest.fixture
def defs(tmp_path, monkeypatch):
    """A defs module of this test's own, as tests/pipeline/test_components.py makes them."""
    import sys
    import uuid

    module = DefsModule(name=f"blocks_{uuid.uuid4().hex[:12]}", root=tmp_path)
    module.folder.mkdir()
    (module.folder / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module.name, None)

YAML_PLACEMENT = """\
  recipe: {gpus_per_node: 1}
  placement:
    node_selector: {nvidia.com/gpu.product: H100}
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
            - matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [H100, H200]}]
    priority_class: team-a-critical
    memory: 64Gi
"""


def test_a_yaml_block_declares_its_placement(defs):
    from pipelines.components import BlockDefinitionError

    defs.write("flowers", FLOWERS)
    defs.write("iris_mlp", training_block("iris_mlp", more=YAML_PLACEMENT))
    (iris,) = [s for s in defs.specs(alongside=[]) if s.name == "iris_mlp"]
    assert iris.placement == Placement(node_selector={"nvidia.com/gpu.product": "H100"},
                                       tolerations=(GPU_TOLERATION,), affinity=H100_ONLY,
                                       priority_class="team-a-critical", memory="64Gi")
    pod = pod_of(iris)
    assert pod["affinity"] == H100_ONLY and pod["containers"][0]["resources"]["limits"]["memory"] == "64Gi"

    path = defs.write("iris_bad", training_block("iris_bad", more="  placement: {tolerations: [{key: a, "
                                                                  "operator: Matches}]}\n"))
    with pytest.raises(BlockDefinitionError, match=re.escape(path) + r".*field 'placement.tolerations\[0\]': "
                       "operator 'Matches'"):
        defs.specs(alongside=[])
    (defs.folder / "iris_bad" / "defs.yaml").write_text(training_block("iris_bad", more="  placement: {tolerate: []}\n"))
    with pytest.raises(BlockDefinitionError, match=r"field 'placement.tolerate': not a field of placement"):
        defs.specs(alongside=[])


@pytest.mark.parametrize("value", ["8", "500m", "1.5", "64Gi", "1536Mi", "2Ki", "100k", "3M", "1e3", "0.5Ti", 7, 2.5])
def test_quantities_are_read_by_the_client_librarys_own_parser(value):
    """The placement checks read quantities with kubernetes' parse_quantity loaded from its module
    file alone (resources/launch/base.parse_quantity); it must read what the library reads."""
    from kubernetes.utils import parse_quantity as library

    from resources.launch.base import parse_quantity

    assert parse_quantity(value) == library(value)


@pytest.mark.parametrize("value", ["8Q", "ki", "1ki", "abc"])
def test_a_quantity_the_library_refuses_is_refused(value):
    from kubernetes.utils import parse_quantity as library

    from resources.launch.base import parse_quantity

    with pytest.raises(ValueError):
        library(value)
    with pytest.raises(ValueError):
        parse_quantity(value)


def test_building_a_pipeline_spec_does_not_import_the_kubernetes_client():
    """Every process that loads definitions builds specs (run workers, code servers, the CLI);
    importing the kubernetes package's API client there cost 0.55 s each, for a quantity check."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from core.placement import Placement; from core.spec import model_pipeline; "
            "model_pipeline('iris', source='iris/*.csv', features=['a'], label='y', classes=['p', 'q'], "
            "placement=Placement(memory='16Gi', shm='4Gi')); print(sorted(m for m in sys.modules if m.startswith('kubernetes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
