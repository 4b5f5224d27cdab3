"""What the orchestrator needs on the Kubernetes profile: per-step `dagster-k8s/config` tag values,
the `k8s_job_executor` config, run tags for the queued run coordinator, and the cluster settings
read from the environment the Helm charts give the Dagster pods.

All pure: `platform_settings(environ)` takes the mapping to read, so nothing is read at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from resources.k8s.fabric import rdma_profile
from resources.k8s.kueue import kueue_settings, scheduler_name
from resources.k8s.manifests import PodSettings, SecretEnv
from resources.launch.base import GpuRequest

StepKind = Literal["cpu", "gpu"]

# Runs carry the platform's run tags (pipelines/automation.py: run_tags): dagster/priority orders
# the queue, platform/model, platform/team and platform/trigger are what the production queue's
# limits (helm/instance/dagster.yaml, helm/dagster-values.yaml) key on, as the local one does.

# Names the Helm chart `helm/model-factory` puts in its ConfigMap (envFrom in the Dagster pods).
# (TRAINING_NAMESPACE / TRAINING_IMAGE are the names pipelines/profiles.py reads.)
ENV_NAMESPACE = "TRAINING_NAMESPACE"
ENV_TRAINING_IMAGE = "TRAINING_IMAGE"
ENV_TRAINING_SA = "MODEL_FACTORY_TRAINING_SERVICE_ACCOUNT"
ENV_SHARED_CLAIM = "MODEL_FACTORY_SHARED_CLAIM"
ENV_SHARED_MOUNT = "MODEL_FACTORY_SHARED_MOUNT"
ENV_S3_SECRET = "MODEL_FACTORY_S3_SECRET"
ENV_LAKEFS_SECRET = "MODEL_FACTORY_LAKEFS_SECRET"
# The training pods' own keys (least privilege: read shards, write their run's checkpoints), apart
# from the orchestrator's above. A ConfigMap without them (charts before the split) gives the
# training pods the orchestrator's Secrets, as before.
ENV_TRAINING_S3_SECRET = "MODEL_FACTORY_TRAINING_S3_SECRET"
ENV_TRAINING_LAKEFS_SECRET = "MODEL_FACTORY_TRAINING_LAKEFS_SECRET"
ENV_PULL_SECRETS = "MODEL_FACTORY_IMAGE_PULL_SECRETS"
ENV_CLUSTER_DOMAIN = "MODEL_FACTORY_CLUSTER_DOMAIN"
ENV_TRAINING_PRIORITY = "MODEL_FACTORY_TRAINING_PRIORITY_CLASS"
ENV_ADHOC_PRIORITY = "MODEL_FACTORY_ADHOC_PRIORITY_CLASS"

S3_SECRET_KEYS = (
    ("AWS_ACCESS_KEY_ID", False),
    ("AWS_SECRET_ACCESS_KEY", False),
    # Present only for temporary credentials / non-AWS endpoints.
    ("AWS_SESSION_TOKEN", True),
    ("AWS_ENDPOINT_URL", True),
    ("AWS_DEFAULT_REGION", True),
)


# lakeFS's S3 gateway authenticates with lakeFS's own access keys; boto3 in the pods reads AWS_*.
LAKEFS_SECRET_KEYS = (
    ("AWS_ACCESS_KEY_ID", "LAKEFS_ACCESS_KEY_ID"),
    ("AWS_SECRET_ACCESS_KEY", "LAKEFS_SECRET_ACCESS_KEY"),
)


def s3_secret_env(secret: str) -> tuple[SecretEnv, ...]:
    """AWS_* variables from the S3 credentials Secret, by reference."""
    return tuple(SecretEnv(env=k, secret=secret, key=k, optional=opt) for k, opt in S3_SECRET_KEYS)


def lakefs_secret_env(secret: str) -> tuple[SecretEnv, ...]:
    """AWS_* variables from the lakeFS credentials Secret's LAKEFS_* keys, by reference."""
    return tuple(SecretEnv(env=env, secret=secret, key=key) for env, key in LAKEFS_SECRET_KEYS)


def platform_settings(environ: Mapping[str, str], *, image: str | None = None) -> PodSettings:
    """PodSettings from the variables the model-factory chart's ConfigMap sets."""
    missing = [k for k in (ENV_NAMESPACE, ENV_SHARED_CLAIM) if not environ.get(k)]
    image = image or environ.get(ENV_TRAINING_IMAGE)
    if not image:
        missing.append(ENV_TRAINING_IMAGE)
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not set: on the kubernetes profile the Dagster pods load them "
            "from the 'model-factory-platform' ConfigMap (helm/model-factory); add it to the "
            "code location's envConfigMaps as helm/dagster-values.yaml does."
        )
    # Both names are read, so the launcher resource carries every chart setting (platform_environ).
    orchestrator_s3, orchestrator_lakefs = environ.get(ENV_S3_SECRET), environ.get(ENV_LAKEFS_SECRET)
    secret = environ.get(ENV_TRAINING_S3_SECRET) or orchestrator_s3
    lakefs = environ.get(ENV_TRAINING_LAKEFS_SECRET) or orchestrator_lakefs
    pull = tuple(s for s in environ.get(ENV_PULL_SECRETS, "").split(",") if s)
    return PodSettings(
        namespace=environ[ENV_NAMESPACE],
        image=image,
        service_account=environ.get(ENV_TRAINING_SA, "model-factory-training"),
        shared_claim=environ[ENV_SHARED_CLAIM],
        shared_mount_path=environ.get(ENV_SHARED_MOUNT, "/mnt/training"),
        secret_env=s3_secret_env(secret) if secret else (),
        image_pull_secrets=pull,
        cluster_domain=environ.get(ENV_CLUSTER_DOMAIN, "cluster.local"),
        rdma=rdma_profile(environ),
        training_priority_class=environ.get(ENV_TRAINING_PRIORITY) or None,
        adhoc_priority_class=environ.get(ENV_ADHOC_PRIORITY) or None,
        lakefs_secret_env=lakefs_secret_env(lakefs) if lakefs else (),
        kueue=kueue_settings(environ),
        scheduler_name=scheduler_name(environ),
    )


class _ReadKeys(Mapping[str, str]):
    """A mapping that remembers which keys were looked up (present or not)."""

    def __init__(self, environ: Mapping[str, str]):
        self._environ, self.read = environ, set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._environ[key]

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self._environ.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(key)
        return key in self._environ

    def __iter__(self):
        return iter(self._environ)

    def __len__(self) -> int:
        return len(self._environ)


def platform_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The keys of `environ` that `platform_settings` reads (the chart ConfigMap's settings) and
    nothing else: what the orchestrator's launcher resource carries, so step pods and training pods
    take their settings from one place and no unrelated (possibly secret) variable is copied.
    Raises platform_settings' error when a required key is missing."""
    recorder = _ReadKeys(environ)
    platform_settings(recorder)
    return {k: str(environ[k]) for k in sorted(recorder.read) if k in environ}


@dataclass(frozen=True, kw_only=True)
class StepPodDefaults:
    """Sizes of ordinary (CPU) step pods."""

    cpu: str = "1"
    memory: str = "4Gi"
    run_as_user: int = 1000


def step_k8s_config(
    kind: StepKind, gpu: GpuRequest | None = None, *, defaults: StepPodDefaults | None = None
) -> dict[str, Any]:
    """The `dagster-k8s/config` tag value for one asset's step pod.

    "cpu": a CPU pod (data prep, checks, and the training *launch* step: its GPUs are in the
    pods the KubernetesTrainingLauncher creates, so the step itself stays small).
    "gpu": a pod that holds GPUs itself, for steps that use them in-process (evaluation); takes
    the GpuRequest's resource name, count, selector, tolerations, priority and shm size.
    The shared volume is not added here: the run launcher's volumes (helm/dagster-values.yaml)
    reach every run and step pod, and a second entry for the same mount path would be rejected.
    """
    d = defaults or StepPodDefaults()
    if kind not in ("cpu", "gpu"):
        raise ValueError(f"step kind {kind!r}: use 'cpu' or 'gpu'.")
    if kind == "gpu" and (gpu is None or gpu.gpus_per_node < 1):
        raise ValueError(
            "step_k8s_config('gpu', ...) needs a GpuRequest with gpus_per_node >= 1; use 'cpu' "
            "for steps without GPUs."
        )
    cpu, memory = (gpu.cpu_request, gpu.memory_request) if kind == "gpu" and gpu else (d.cpu, d.memory)
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {"memory": memory}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    pod_spec: dict[str, Any] = {
        "security_context": {
            "run_as_non_root": True,
            "run_as_user": d.run_as_user,
            "run_as_group": d.run_as_user,
            "fs_group": d.run_as_user,
            "seccomp_profile": {"type": "RuntimeDefault"},
        },
    }
    if kind == "gpu" and gpu is not None:
        requests[gpu.resource_name] = str(gpu.gpus_per_node)
        limits[gpu.resource_name] = str(gpu.gpus_per_node)
        volumes.append(
            {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": gpu.shm_limit}}
        )
        mounts.append({"name": "dshm", "mount_path": "/dev/shm"})
        if gpu.node_selector:
            pod_spec["node_selector"] = dict(gpu.node_selector)
        if gpu.tolerations:
            pod_spec["tolerations"] = [dict(t) for t in gpu.tolerations]
        if gpu.affinity:
            # In the API's camelCase, as the placement declares it: dagster-k8s maps either spelling.
            pod_spec["affinity"] = dict(gpu.affinity)
        if gpu.priority_class:
            pod_spec["priority_class_name"] = gpu.priority_class
    if volumes:
        pod_spec["volumes"] = volumes
    security = {
        "allow_privilege_escalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        # Dagster's step process writes under DAGSTER_HOME and the compute log manager stages
        # files locally before upload, so the root filesystem stays writable for step pods.
        "read_only_root_filesystem": False,
        "run_as_non_root": True,
        "seccomp_profile": {"type": "RuntimeDefault"},
    }
    container: dict[str, Any] = {
        "resources": {"requests": requests, "limits": limits},
        "security_context": security,
    }
    if mounts:
        container["volume_mounts"] = mounts
    return {
        "container_config": container,
        "pod_spec_config": pod_spec,
        "pod_template_spec_metadata": {"labels": {"model-factory.io/step-kind": kind}},
    }


def k8s_executor_config(
    settings: PodSettings, *, runner_service_account: str, max_concurrent: int = 8
) -> dict[str, Any]:
    """Config for `dagster_k8s.k8s_job_executor.configured(...)` on the kubernetes profile."""
    return {
        "job_namespace": settings.namespace,
        "service_account_name": runner_service_account,
        "load_incluster_config": True,
        "max_concurrent": max_concurrent,
        # Step Jobs are deleted with their run pod, so a killed run leaves no step pods.
        "enable_owner_references": True,
        "image_pull_policy": settings.image_pull_policy,
        "step_k8s_config": step_k8s_config(
            "cpu", defaults=StepPodDefaults(run_as_user=settings.run_as_user)
        ),
    }
