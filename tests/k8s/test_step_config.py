"""Per-step `dagster-k8s/config` values: put on a real asset as op tags, parsed by dagster-k8s's
own `get_user_defined_k8s_config`, turned into a Job by its `construct_dagster_k8s_job`, and
the resulting manifest validated against the Kubernetes schemas."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._config import validate_config
from dagster_k8s.executor import _K8S_EXECUTOR_CONFIG_SCHEMA
from dagster_k8s.job import (
    DagsterK8sJobConfig,
    construct_dagster_k8s_job,
    get_user_defined_k8s_config,
)
from kubernetes.client import ApiClient

from resources.k8s.manifests import container_security_context
from resources.k8s.step_config import (
    ENV_NAMESPACE,
    ENV_S3_SECRET,
    ENV_SHARED_CLAIM,
    ENV_TRAINING_IMAGE,
    k8s_executor_config,
    platform_settings,
    step_k8s_config,
)
from resources.launch.base import GpuRequest
from tests.k8s.helpers import validate_all

# What the run launcher (helm/dagster-values.yaml) gives every run and step pod.
RUN_LAUNCHER_JOB_CONFIG = DagsterK8sJobConfig(
    job_image="registry.example.com/model-factory/code-location:abc123",
    dagster_home="/opt/dagster/dagster_home",
    image_pull_policy="IfNotPresent",
    service_account_name="dagster",
    instance_config_map="dagster-instance",
    postgres_password_secret="dagster-postgresql-secret",
    env_config_maps=["model-factory-platform"],
    env_secrets=["model-factory-s3", "model-factory-lakefs"],
    volume_mounts=[{"name": "model-factory-shared", "mountPath": "/mnt/training"}],
    volumes=[{"name": "model-factory-shared", "persistentVolumeClaim": {"claimName": "model-factory-shared"}}],
)

GPU = GpuRequest(
    gpus_per_node=2,
    resource_name="nvidia.com/mig-3g.40gb",
    node_selector={"nvidia.com/gpu.product": "A100"},
    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    cpu="6",
    memory="48Gi",
    shm_size="8Gi",
    priority_class="model-factory-adhoc",
)


def _step_job_from_asset_tags(config: dict) -> dict:
    """The Job dagster-k8s would create for a step of an asset tagged with `config`."""

    @dg.asset(op_tags={"dagster-k8s/config": config})
    def evaluated_model() -> None:
        """An asset whose step pod takes the given config."""

    tags = evaluated_model.op.tags
    user_defined = get_user_defined_k8s_config(tags)
    job = construct_dagster_k8s_job(
        job_config=RUN_LAUNCHER_JOB_CONFIG,
        args=["dagster", "api", "execute_step", "{}"],
        job_name="dagster-step-0123456789abcdef",
        user_defined_k8s_config=user_defined,
        component="step_worker",
    )
    return ApiClient().sanitize_for_serialization(job)


def test_cpu_step_pod_validates_and_is_small_and_restricted():
    job = _step_job_from_asset_tags(step_k8s_config("cpu"))
    assert validate_all([job]) == 1
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "4Gi"}
    assert not any("nvidia.com" in k for k in container["resources"]["limits"])
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The shared volume comes from the run launcher, exactly once.
    assert [v["name"] for v in pod["volumes"]].count("model-factory-shared") == 1
    assert "nodeSelector" not in pod and "priorityClassName" not in pod


def test_gpu_step_pod_gets_the_request():
    job = _step_job_from_asset_tags(step_k8s_config("gpu", GPU))
    assert validate_all([job]) == 1
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    res = container["resources"]
    assert res["requests"]["nvidia.com/mig-3g.40gb"] == res["limits"]["nvidia.com/mig-3g.40gb"] == "2"
    assert res["requests"]["cpu"] == "6" and res["limits"]["memory"] == "48Gi"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "A100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "model-factory-adhoc"
    shm = {v["name"]: v for v in pod["volumes"]}["dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_step_and_training_pods_share_the_same_hardening():
    step = step_k8s_config("cpu")["container_config"]["security_context"]
    training = container_security_context(read_only_root=False)
    as_snake = {"".join("_" + c.lower() if c.isupper() else c for c in k): v for k, v in training.items()}
    assert step == as_snake


def test_gpu_kind_needs_gpus():
    with pytest.raises(ValueError, match="gpus_per_node >= 1"):
        step_k8s_config("gpu", GpuRequest())
    with pytest.raises(ValueError, match="use 'cpu' or 'gpu'"):
        step_k8s_config("tpu")  # type: ignore[arg-type]


ENVIRON = {
    ENV_NAMESPACE: "model-factory",
    ENV_TRAINING_IMAGE: "registry.example.com/model-factory/training:abc123",
    ENV_SHARED_CLAIM: "model-factory-shared",
    ENV_S3_SECRET: "model-factory-s3",
}


def test_executor_config_is_accepted_by_the_k8s_executor_schema():
    config = k8s_executor_config(platform_settings(ENVIRON), runner_service_account="dagster")
    result = validate_config(_K8S_EXECUTOR_CONFIG_SCHEMA, config)
    assert result.success, result.errors
    assert config["job_namespace"] == "model-factory"
    assert config["enable_owner_references"] is True


def test_platform_settings_name_what_is_missing():
    with pytest.raises(ValueError, match="TRAINING_NAMESPACE, MODEL_FACTORY_SHARED_CLAIM, TRAINING_IMAGE"):
        platform_settings({})
    s = platform_settings(ENVIRON)
    assert {e.env for e in s.secret_env} >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert all(e.secret == "model-factory-s3" for e in s.secret_env)


