"""Training pods are sized per GPU (cpu, memory, /dev/shm), from the recipe through the job to the
Kubernetes objects, and bad sizes fail where the pipeline is defined, naming the field."""

from __future__ import annotations

import dataclasses
import math

import pytest

from core.spec import PipelineDefinitionError, PipelineSpec, Recipe, Source
from ops.training_config import training_job
from resources.k8s.feasibility import InfeasibleGpuRequest, check_feasibility
from resources.k8s.manifests import build_training_job
from resources.k8s.step_config import step_k8s_config
from resources.launch.base import GpuRequest
from tests.k8s.helpers import GPU_TOLERATION, h100, make_job, validate_all

CONFIG = {"output_dir": "/mnt/training/toy/out", "checkpoint": {"dir": "/mnt/training/toy/ckpt"}}


def _spec(**recipe):
    return PipelineSpec(name="toy", source=Source(paths=("x.csv",)), feature_columns=("a", "b"), label_column="y",
                        class_names=("0", "1"), recipe=Recipe(**recipe))


def _trainer(manifest):
    return manifest["spec"]["template"]["spec"]["containers"][0]


def _shm(manifest):
    (dshm,) = [v for v in manifest["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    return dshm["emptyDir"]["sizeLimit"]


@pytest.mark.parametrize("gpus, cpu, memory, shm", [
    (0, "2", "8Gi", "2Gi"),  # CPU-only (gloo): the floor
    (1, "10", "96Gi", "4Gi"),
    (4, "40", "384Gi", "16Gi"),
    (8, "80", "768Gi", "32Gi"),
])
def test_default_pod_size_grows_with_the_gpu_count(settings, gpus, cpu, memory, shm):
    job = make_job(nproc=max(1, gpus), gpus=gpus)
    assert (job.gpu.cpu_request, job.gpu.memory_request, job.gpu.shm_limit) == (cpu, memory, shm)
    m = build_training_job(job, settings)
    validate_all([m])
    res = _trainer(m)["resources"]
    assert res["requests"]["cpu"] == cpu and res["requests"]["memory"] == memory
    # memory limit = request (the OOM shows as the container's reason); no CPU limit (no throttling)
    assert res["limits"]["memory"] == memory and "cpu" not in res["limits"]
    assert _shm(m) == shm


def test_fractional_sizes_become_exact_quantities(settings):
    job = make_job(nproc=1, cpu_per_gpu=1.5, memory_gib_per_gpu=12.5, shm_gib_per_gpu=2.25)
    assert (job.gpu.cpu_request, job.gpu.memory_request, job.gpu.shm_limit) == ("2", "12800Mi", "2304Mi")
    three = make_job(nproc=3, gpus=3, cpu_per_gpu=1.5)
    assert three.gpu.cpu_request == "4500m"
    validate_all([build_training_job(three, settings)])


def test_fixed_sizes_override_the_per_gpu_ones():
    gpu = GpuRequest(gpus_per_node=8, cpu="6", memory="48Gi", shm_size="8Gi")
    assert (gpu.cpu_request, gpu.memory_request, gpu.shm_limit) == ("6", "48Gi", "8Gi")


@pytest.mark.parametrize("field, value, says", [
    ("cpu_per_gpu", 0, "must be a positive number"),
    ("cpu_per_gpu", -1.0, "must be a positive number"),
    ("memory_gib_per_gpu", math.nan, "must be a positive number"),
    ("memory_gib_per_gpu", math.inf, "must be a positive number"),
    ("shm_gib_per_gpu", True, "must be a positive number"),
    ("cpu_per_gpu", "8", "must be a positive number"),
    ("shm_gib_per_gpu", 96.0, "must stay below memory_gib_per_gpu"),
    ("cpu_per_gpu", 0.0001, "below one millicore"),
])
def test_bad_sizes_fail_in_the_spec_and_the_request_naming_the_field(field, value, says):
    with pytest.raises(PipelineDefinitionError, match=rf"field 'recipe\.{field}': .*{says}"):
        _spec(**{field: value})
    with pytest.raises(ValueError, match=rf"GpuRequest\.{field}: .*{says}"):
        GpuRequest(gpus_per_node=1, **{field: value})


@pytest.mark.parametrize("field, value", [("cpu", "ten"), ("memory", "64GB"), ("shm_size", "")])
def test_fixed_sizes_must_be_quantities(field, value):
    with pytest.raises(ValueError, match=rf"GpuRequest\.{field}=.* is not a Kubernetes quantity"):
        GpuRequest(**{field: value})


def test_recipe_defaults_are_the_requests_defaults():
    recipe, gpu = Recipe(), GpuRequest()
    for name in ("cpu_per_gpu", "memory_gib_per_gpu", "shm_gib_per_gpu"):
        assert getattr(recipe, name) == getattr(gpu, name), name


def test_the_recipe_sizes_the_pod_through_training_job(settings):
    spec = _spec(gpus_per_node=2, world_size=2, cpu_per_gpu=6, memory_gib_per_gpu=40, shm_gib_per_gpu=8)
    job = training_job(spec, "0123456789abcdef", CONFIG)
    assert (job.gpu.cpu_per_gpu, job.gpu.memory_gib_per_gpu, job.gpu.shm_gib_per_gpu) == (6, 40, 8)
    m = build_training_job(job, settings)
    validate_all([m])
    res = _trainer(m)["resources"]
    assert res["requests"] == {"cpu": "12", "memory": "80Gi", "nvidia.com/gpu": "2"}
    assert _shm(m) == "16Gi"


def test_default_8_gpu_pod_fits_the_smallest_common_8_gpu_node_and_not_twice():
    gpu = GpuRequest(nodes=1, gpus_per_node=8, tolerations=(GPU_TOLERATION,))
    assert check_feasibility(gpu, [h100("gpu-a")]) == ["gpu-a"]
    # Two 4-GPU pods share such a node; their CPUs (2 x 40 of 96) still fit.
    assert check_feasibility(dataclasses.replace(gpu, nodes=2, gpus_per_node=4), [h100("gpu-a")]) == ["gpu-a"]


def test_feasibility_names_cpu_and_memory_and_the_recipe_fields_to_lower():
    small = h100("gpu-s", cpu="48", memory="512Gi")
    with pytest.raises(InfeasibleGpuRequest) as info:
        check_feasibility(GpuRequest(gpus_per_node=8, tolerations=(GPU_TOLERATION,)), [small])
    msg = str(info.value)
    assert "gpu-s: allocatable cpu=48 < 80; allocatable memory=512Gi < 768Gi" in msg
    assert "cpu_per_gpu / memory_gib_per_gpu" in msg


def test_gpu_step_pods_take_the_same_sizes():
    config = step_k8s_config("gpu", GpuRequest(gpus_per_node=2))
    container = config["container_config"]
    assert container["resources"]["requests"] == {"cpu": "20", "memory": "192Gi", "nvidia.com/gpu": "2"}
    assert config["pod_spec_config"]["volumes"][0]["empty_dir"]["size_limit"] == "8Gi"
