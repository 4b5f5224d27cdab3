"""Pure builders for the Kubernetes objects of one training launch.

Nothing here talks to a cluster: every function takes plain values and returns plain dicts (the
shape `kubectl apply` and the Python client accept), so the shapes are unit-tested by the dozen
and validated against the official schemas. `client.py` submits them.

One launch is always an Indexed Job (completions = parallelism = nodes). A single node is the
same object with one index, which keeps the watch, cleanup and Pipes code paths identical. With
several nodes a headless Service gives each pod the stable name `<job>-<i>.<svc>.<ns>.svc.<domain>`
and torchrun's c10d rendezvous runs on pod 0's name.

Outputs and checkpoints live on a shared ReadWriteMany volume (PVC) mounted at the same path in
the training pods and in the Dagster step pod that launched them, so the step reads `output_dir`
as plain files once the Job succeeds, and a restarted launch resumes from the same checkpoints.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from resources.k8s.fabric import RdmaProfile
from resources.k8s.kueue import KueueSettings, queue_labels, queued_job
from resources.launch.base import GpuRequest, TrainingJob
from training_runtime.distributed.allocator import allocator_env
from training_runtime.distributed.elastic import ELASTIC_ENV

# Max length of a Job name: pod hostnames are `<job>-<index>` and must stay a DNS label (63);
# the Job controller also appends a 5-char suffix plus the index to pod names.
MAX_JOB_NAME = 48
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

TRAINER_CONTAINER = "trainer"
# Label on every pod and on the Service selector; the Job controller's own `job-name` label
# exists too, but ours is set by us in the template, so the selector cannot drift from it.
JOB_LABEL = "model-factory.io/training-job"
RENDEZVOUS_LABEL = "model-factory.io/rendezvous-of"  # an elastic gang's rendezvous store pod: its Job
RENDEZVOUS_CONTAINER = "rendezvous"
# Kueue admits a Job with this annotation at a parallelism down to its value (partial admission).
KUEUE_MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Env var carrying the pod's completion index, filled from the annotation by the downward API.
# Defined explicitly (the controller injects JOB_COMPLETION_INDEX too) so `$(POD_INDEX)` in the
# args is expanded by the kubelet from an env entry that is visible in our own manifest.
POD_INDEX_ENV = "POD_INDEX"


@dataclass(frozen=True, kw_only=True)
class SecretEnv:
    """One environment variable read from a Kubernetes Secret (never a literal value)."""

    env: str  # name inside the container, e.g. AWS_ACCESS_KEY_ID
    secret: str  # Secret name in the training namespace
    key: str  # key inside the Secret
    optional: bool = False  # True for keys such as AWS_SESSION_TOKEN that not every Secret has


@dataclass(frozen=True, kw_only=True)
class PodSettings:
    """Cluster-side settings shared by every training launch (they come from the Helm chart)."""

    namespace: str
    image: str
    service_account: str = "model-factory-training"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    shared_claim: str = "model-factory-shared"
    shared_mount_path: str = "/mnt/training"
    secret_env: tuple[SecretEnv, ...] = ()
    entry_module: str = "training_runtime"
    rendezvous_port: int = 29400
    # torchrun waits this long for all nodes to join: pods of one Job may start minutes apart
    # (image pulls, autoscaled nodes).
    rendezvous_join_timeout_s: int = 900
    # Once min nodes have joined a round, how long the rendezvous waits for more (torchrun's default)
    rendezvous_last_call_s: int = 30
    cluster_domain: str = "cluster.local"
    ttl_seconds_after_finished: int = 3600
    active_deadline_seconds: int | None = None
    run_as_user: int = 1000
    run_as_group: int = 1000
    labels: Mapping[str, str] = field(default_factory=dict)
    # NCCL over InfiniBand/RoCE for multi-node Jobs (resources/k8s/fabric.py); None: TCP on the pod network.
    rdma: RdmaProfile | None = None
    # The chart's PriorityClasses (helm/model-factory priorityClasses): scheduled and new-data runs
    # take the first, runs started by hand the second, unless the pipeline's placement names one.
    training_priority_class: str | None = None
    adhoc_priority_class: str | None = None
    # The lakeFS credentials Secret (chart value secrets.lakefs.trainingName) as AWS_* variables: pods that
    # read shards through lakeFS's S3 gateway get these instead of the S3 secret's (secret_env).
    lakefs_secret_env: tuple[SecretEnv, ...] = ()
    # Kueue queueing (resources/k8s/kueue.py): Jobs start suspended in the team's LocalQueue; None: off.
    kueue: KueueSettings | None = None
    # The chart's optional bin-packing scheduler (binPackingScheduler); None: the default scheduler.
    scheduler_name: str | None = None


def reads_through_lakefs(config: Mapping[str, Any]) -> bool:
    """Whether the runtime reads its shards through lakeFS's S3 gateway: s3:// locations served at the
    store's endpoint (the lakeFS store alone sets `data.s3_endpoint_url`, core/pinned_shards.py). The
    gateway accepts lakeFS's own access keys, never the object store's."""
    data = config.get("data") or {}
    locations = data.get("locations") or {}
    return bool(data.get("s3_endpoint_url")) and any(str(u).startswith("s3://") for u in locations.values())


def credential_env(job: TrainingJob, settings: PodSettings) -> tuple[SecretEnv, ...]:
    """The Secret-backed variables of a launch's pods: the lakeFS keys for a job that reads through
    the lakeFS gateway, the S3 secret's otherwise (both arrive as AWS_*, which boto3 reads)."""
    if not reads_through_lakefs(job.config):
        return settings.secret_env
    if not settings.lakefs_secret_env:
        raise ValueError(
            f"training job {job.name!r} reads its shards through lakeFS's S3 gateway "
            f"({job.config['data']['s3_endpoint_url']}) but no lakeFS Secret is configured: set the "
            "model-factory chart's secrets.lakefs.trainingName (MODEL_FACTORY_TRAINING_LAKEFS_SECRET in the "
            "model-factory-platform ConfigMap) to the Secret holding the training pods' LAKEFS_ACCESS_KEY_ID "
            "and LAKEFS_SECRET_ACCESS_KEY."
        )
    return settings.lakefs_secret_env


# Tags Dagster itself puts on runs a schedule or a sensor requests (dagster._core.storage.tags).
SCHEDULE_NAME_TAG = "dagster/schedule_name"
SENSOR_NAME_TAG = "dagster/sensor_name"
# The platform's own trigger tag (pipelines/automation.py run_tags): "schedule", "new_data" or "ad_hoc".
TRIGGER_TAG = "platform/trigger"
AUTOMATED_TRIGGERS = ("schedule", "new_data")


def is_automated_run(tags: Mapping[str, str]) -> bool:
    """Whether a schedule or sensor started the run (Dagster's own tags, or the platform's trigger tag
    that run_tags sets on schedule and sensor requests); a run started by hand is not."""
    return bool(tags.get(SCHEDULE_NAME_TAG) or tags.get(SENSOR_NAME_TAG)) \
        or tags.get(TRIGGER_TAG) in AUTOMATED_TRIGGERS


def with_run_priority(job: TrainingJob, settings: PodSettings, run_tags: Mapping[str, str]) -> TrainingJob:
    """`job` with its pods' priority class: the pipeline's own if its placement names one, else the
    chart's training class for a run a schedule or sensor started and its ad-hoc class otherwise."""
    if job.gpu.priority_class:
        return job
    chosen = settings.training_priority_class if is_automated_run(run_tags) else settings.adhoc_priority_class
    if not chosen:
        return job
    return replace(job, gpu=replace(job.gpu, priority_class=chosen))


def validate_job(job: TrainingJob) -> None:
    """Reject a launch whose name or GPU request contradicts the job before anything is built."""
    if len(job.name) > MAX_JOB_NAME or not _DNS_LABEL.match(job.name):
        raise ValueError(
            f"TrainingJob.name {job.name!r} must be a DNS label of at most {MAX_JOB_NAME} "
            "characters (lowercase letters, digits, '-'); it names the Job, Service and pod "
            "hostnames. Derive it from the run id, e.g. 'train-' + run_id[:8]."
        )
    gpu = job.gpu
    if job.nnodes < 1 or job.nproc_per_node < 1:
        raise ValueError("TrainingJob.nnodes and nproc_per_node must both be at least 1.")
    if gpu.nodes != job.nnodes:
        raise ValueError(
            f"TrainingJob.nnodes={job.nnodes} but gpu.nodes={gpu.nodes}: set both to the number "
            "of pods the job should span."
        )
    if gpu.gpus_per_node and gpu.gpus_per_node != job.nproc_per_node:
        raise ValueError(
            f"gpu.gpus_per_node={gpu.gpus_per_node} but nproc_per_node={job.nproc_per_node}: "
            "torchrun starts one process per GPU, so set them equal."
        )
    for key in gpu.nccl_env:
        if not (key.startswith("NCCL_") or key.startswith("TORCH_NCCL_")):
            raise ValueError(
                f"gpu.nccl_env key {key!r} is not an NCCL setting; put other variables in "
                "TrainingJob.env (non-secret) or in a Secret referenced by the chart."
            )
    for key in {**job.env, **gpu.nccl_env}:
        if not _ENV_NAME.match(key):
            raise ValueError(f"environment variable name {key!r} is not a valid identifier.")


def service_name(job: TrainingJob) -> str:
    """The headless Service shares the Job's name: `<job>-0.<job>.<ns>.svc` reads naturally."""
    return job.name


def pod_fqdn(job: TrainingJob, settings: PodSettings, index: int | str) -> str:
    """Stable DNS name of pod `index`.

    The full name including the cluster domain is what the kubelet writes into the pod's own
    /etc/hosts when `subdomain` is set, so pod 0 recognises the rendezvous host as itself without
    waiting for the DNS record, and torchrun decides to host the c10d store there."""
    return (
        f"{job.name}-{index}.{service_name(job)}.{settings.namespace}.svc."
        f"{settings.cluster_domain}"
    )


def rendezvous_store_name(job: TrainingJob) -> str:
    """An elastic gang's rendezvous store: its Pod and Service (at most 63 characters)."""
    return f"{job.name[:58].rstrip('-')}-rdzv"


def rendezvous_endpoint(job: TrainingJob, settings: PodSettings) -> str:
    """Pod 0 hosts a fixed gang's c10d store; an elastic gang's lives in a pod of its own, which a
    lost node does not take with it (build_rendezvous_store)."""
    if job.elastic:
        return (f"{rendezvous_store_name(job)}.{settings.namespace}.svc.{settings.cluster_domain}:"
                f"{settings.rendezvous_port}")
    return f"{pod_fqdn(job, settings, 0)}:{settings.rendezvous_port}"


def config_path(job: TrainingJob, settings: PodSettings) -> str:
    """Where the launcher writes the runtime's JSON config on the shared volume."""
    return posixpath.join(settings.shared_mount_path, "launches", job.name, "config.json")


def torchrun_args(job: TrainingJob, settings: PodSettings) -> list[str]:
    """The trainer container's command: torchrun wrapping `python -m <entry_module>`."""
    args = ["torchrun", f"--nproc-per-node={job.nproc_per_node}"]
    if job.nnodes == 1:
        # One pod: a local rendezvous; no Service, no DNS.
        args += ["--standalone", "--nnodes=1"]
    else:
        conf = f"join_timeout={settings.rendezvous_join_timeout_s},last_call_timeout={settings.rendezvous_last_call_s}"
        if job.elastic:
            # No agent hosts the store; each waits for the store's pod as long as for its peers.
            conf += f",is_host=false,read_timeout={settings.rendezvous_join_timeout_s}"
        args += [
            f"--nnodes={job.nnodes_arg}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rendezvous_endpoint(job, settings)}",
            f"--rdzv-id={job.name}",
            f"--rdzv-conf={conf}",
            # c10d assigns node ranks by sorting node addresses; each pod's own stable name
            # (pod 0 sorts first) puts global rank 0, which reports through Pipes, on pod 0,
            # whose logs the launcher reads. The kubelet expands $(POD_INDEX).
            f"--local-addr={pod_fqdn(job, settings, f'$({POD_INDEX_ENV})')}",
        ]
    if job.max_restarts:
        args.append(f"--max-restarts={job.max_restarts}")
    args += ["-m", settings.entry_module, "--config", config_path(job, settings)]
    return args


def rdma_for(job: TrainingJob, settings: PodSettings) -> RdmaProfile | None:
    """The RDMA profile a launch uses: the cluster's, for multi-node Jobs only (one pod's ranks
    talk over NVLink/PCIe and shared memory, so an RDMA device would sit idle)."""
    return settings.rdma if job.nnodes > 1 else None


def pod_extended_resources(job: TrainingJob, settings: PodSettings) -> dict[str, str]:
    """Extended resources of one pod (GPUs or MIG slices, RDMA devices): limit == request."""
    extended: dict[str, str] = {}
    if job.gpu.gpus_per_node:
        extended[job.gpu.resource_name] = str(job.gpu.gpus_per_node)
    rdma = rdma_for(job, settings)
    if rdma is not None:
        extended.update(rdma.resources())
    return extended


def _resources(gpu: GpuRequest, extended: Mapping[str, str]) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": gpu.cpu_request, "memory": gpu.memory_request}
    # Memory limit = request: a training pod over its request would be the first OOM victim
    # anyway, and equal values make the OOM visible as the container's reason. No CPU limit: CFS
    # throttling of the kernel-launch threads would stall every GPU of the pod.
    limits: dict[str, Any] = {"memory": gpu.memory_request}
    # Extended resources (GPUs, MIG slices, RDMA devices) must have limit == request.
    requests.update(extended)
    limits.update(extended)
    return {"requests": requests, "limits": limits}


def container_security_context(
    *, read_only_root: bool = True, add_capabilities: tuple[str, ...] = ()
) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add_capabilities:
        # Applied after the drop: the container keeps exactly these.
        capabilities["add"] = list(add_capabilities)
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
        "privileged": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security_context(settings: PodSettings) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_group,
        # fsGroup makes the shared volume writable by the non-root user.
        "fsGroup": settings.run_as_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(
    job: TrainingJob, settings: PodSettings, pipes_env: Mapping[str, str]
) -> list[dict[str, Any]]:
    rdma = rdma_for(job, settings)
    plain: dict[str, str] = {
        # The root filesystem is read-only; caches (torch hub, triton, matplotlib) go to /tmp.
        "HOME": "/tmp",
        "XDG_CACHE_HOME": "/tmp/.cache",
        "PYTHONUNBUFFERED": "1",
        # The image reference the pod runs, for the runtime's lineage (training_runtime/observe/build_info.py).
        "MODEL_FACTORY_IMAGE": settings.image,
        # The cluster's fabric first: a job's own NCCL settings below override it.
        **(rdma.nccl_env() if rdma else {}),
        # A multi-node gang's workers get a fresh rendezvous store each round, hosted by rank 0:
        # torchrun's shared store is namespaced by a restart count that only the failing pod's
        # agent increments, so a restarted gang would not meet (training_runtime/distributed/
        # process_group.py, _attempt_store).
        **({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if job.nnodes > 1 else {}),
        # An elastic gang's workers agree on their attempt's name through rank 0 (the agents'
        # restart counts differ; training_runtime/distributed/elastic.py).
        **({ELASTIC_ENV: f"{job.min_nodes}:{job.nnodes}"} if job.elastic else {}),
        # FSDP's freed buffers leave RSS only with a fixed mmap threshold (training_runtime/
        # distributed/allocator.py); the job's own env below overrides it.
        **allocator_env(job.config),
        **job.env,
        **job.gpu.nccl_env,
        **pipes_env,
    }
    secrets = credential_env(job, settings)
    secret_names = {s.env for s in secrets}
    clash = secret_names & set(plain)
    if clash:
        raise ValueError(
            f"{sorted(clash)} are set both as plain env and from a Secret; remove them from "
            "TrainingJob.env so credentials only come from the Secret."
        )
    env: list[dict[str, Any]] = [
        {
            "name": POD_INDEX_ENV,
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}
            },
        },
        # Downward API: which node and pod each rank ran on, for the lineage (pod_lineage.py).
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    env += [{"name": k, "value": v} for k, v in plain.items()]
    env += [
        {
            "name": s.env,
            "valueFrom": {
                "secretKeyRef": {"name": s.secret, "key": s.key, "optional": s.optional}
            },
        }
        for s in secrets
    ]
    return env


def _labels(job: TrainingJob, settings: PodSettings) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "model-factory-training",
        "app.kubernetes.io/managed-by": "model-factory",
        **settings.labels,
        JOB_LABEL: job.name,
    }


def _place(spec: dict[str, Any], gpu: GpuRequest, settings: PodSettings, *, gang_pod: bool) -> None:
    """Where a pod of a launch may run and how it is pulled: the pipeline's node selector,
    tolerations and priority class, the cluster's pull secrets. A training pod also takes the
    pipeline's affinity and the cluster's (bin-packing) scheduler; the rendezvous store pod, which
    holds no GPU, only has to be allowed where the training pods are."""
    if gpu.node_selector:
        spec["nodeSelector"] = dict(gpu.node_selector)
    if gpu.tolerations:
        spec["tolerations"] = [dict(t) for t in gpu.tolerations]
    if gang_pod and gpu.affinity:
        spec["affinity"] = gpu.affinity
    if gpu.priority_class:
        spec["priorityClassName"] = gpu.priority_class
    if gang_pod and settings.scheduler_name:
        spec["schedulerName"] = settings.scheduler_name
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]


def build_pod_template(
    job: TrainingJob, settings: PodSettings, pipes_env: Mapping[str, str]
) -> dict[str, Any]:
    gpu = job.gpu
    rdma = rdma_for(job, settings)
    volumes: list[dict[str, Any]] = [
        {"name": "shared", "persistentVolumeClaim": {"claimName": settings.shared_claim}},
        # NCCL's shared-memory transport and DataLoader workers use /dev/shm; the container
        # runtime's default of 64 MiB makes them crash with "bus error", so it is a memory-backed
        # volume sized per GPU (it counts against the pod's memory limit).
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": gpu.shm_limit}},
        {"name": "tmp", "emptyDir": {}},
    ]
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": torchrun_args(job, settings),
        "env": _env(job, settings, pipes_env),
        "resources": _resources(gpu, pod_extended_resources(job, settings)),
        "securityContext": container_security_context(add_capabilities=rdma.capabilities() if rdma else ()),
        "volumeMounts": [
            {"name": "shared", "mountPath": settings.shared_mount_path},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if job.nnodes > 1:
        container["ports"] = [
            {"name": "rdzv", "containerPort": settings.rendezvous_port, "protocol": "TCP"}
        ]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        # Training code needs no Kubernetes API access.
        "automountServiceAccountToken": False,
        # Service links inject one env var per Service in the namespace; noise for torchrun.
        "enableServiceLinks": False,
        "securityContext": pod_security_context(settings),
        "containers": [container],
        "volumes": volumes,
    }
    if job.nnodes > 1:
        spec["subdomain"] = service_name(job)
    _place(spec, gpu, settings, gang_pod=True)
    return {"metadata": {"labels": _labels(job, settings)}, "spec": spec}


def build_training_job(
    job: TrainingJob, settings: PodSettings, pipes_env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The Indexed Job running `torchrun` in each of `job.nnodes` pods."""
    validate_job(job)
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": job.nnodes,
        "parallelism": job.nnodes,
        # torchrun restarts workers itself (max_restarts); a lost pod fails the whole gang at
        # once instead of re-running one index against peers that already gave up.
        "backoffLimit": 0,
        # Deleted by the cluster after success or failure even if the launcher never got to
        # clean up (killed step pod); the Service goes with it through its owner reference.
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "template": build_pod_template(job, settings, pipes_env or {}),
    }
    if job.elastic:
        del spec["backoffLimit"]  # counted per index instead (and 0 would fail the Job at the first loss)
        spec.update(elastic_job_policies(job))
    if settings.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    manifest: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job.name,
            "namespace": settings.namespace,
            "labels": _labels(job, settings),
        },
        "spec": spec,
    }
    if settings.kueue is not None:
        # Suspended in the team's LocalQueue until Kueue admits all of its pods at once; an
        # elastic gang's, as few as min_nodes of them (Kueue's partial admission).
        manifest = queued_job(manifest, queue_labels(job.team, job.gpu.priority_class, settings.kueue))
        if job.elastic:
            manifest["metadata"]["annotations"] = {**manifest["metadata"].get("annotations", {}),
                                                   KUEUE_MIN_PARALLELISM: str(job.min_nodes)}
    return manifest


def elastic_job_policies(job: TrainingJob) -> dict[str, Any]:
    """What lets an elastic gang's Job lose pods without failing (Kubernetes 1.31 Indexed Jobs):

    - a failed pod is replaced in its index (``backoffLimitPerIndex``: max_restarts times), and the
      replacement, with the same stable name, joins the running gang at its next rendezvous; only
      once the old pod is gone (``podReplacementPolicy: Failed``), so one name never runs twice;
    - a pod evicted or preempted (condition DisruptionTarget) does not count against that limit;
    - the Job fails once more indexes have failed for good than the gang can spare
      (``maxFailedIndexes``: nnodes - min_nodes); torchrun's agents fail sooner by themselves, after
      the rendezvous timeout, when fewer than min_nodes remain;
    - the first pod that completes completes the Job (its agent exits 0 only once the training has
      ended), and pods still waiting to join are ended (``successPolicy``)."""
    return {
        "backoffLimitPerIndex": job.max_restarts,
        "maxFailedIndexes": job.nnodes - job.min_nodes,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
        "successPolicy": {"rules": [{"succeededCount": 1}]},
    }


def build_rendezvous_store(job: TrainingJob, settings: PodSettings) -> list[dict[str, Any]]:
    """An elastic gang's c10d store: a small CPU pod running the training image's
    ``training_runtime.distributed.rendezvous_store`` and a Service in front of it. Both are owned
    by the Job (the launcher sets the owner reference once the Job exists), so they go with it.
    It may run wherever the training pods may (same node selector, tolerations and priority)."""
    name, gpu = rendezvous_store_name(job), job.gpu
    labels = {**{k: v for k, v in _labels(job, settings).items() if k != JOB_LABEL}, RENDEZVOUS_LABEL: job.name}
    container = {
        "name": RENDEZVOUS_CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "training_runtime.distributed.rendezvous_store",
                    f"--port={settings.rendezvous_port}", f"--timeout-s={settings.rendezvous_join_timeout_s}"],
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "rdzv", "containerPort": settings.rendezvous_port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spec: dict[str, Any] = {
        # The store's state is the rendezvous: a crashed store restarts empty and the agents re-form.
        "restartPolicy": "Always",
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(settings),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    _place(spec, gpu, settings, gang_pod=False)
    meta = {"name": name, "namespace": settings.namespace, "labels": labels}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta), "spec": {
        "selector": {RENDEZVOUS_LABEL: job.name},
        "ports": [{"name": "rdzv", "port": settings.rendezvous_port, "targetPort": settings.rendezvous_port,
                   "protocol": "TCP"}]}}
    return [pod, service]


def build_headless_service(
    job: TrainingJob, settings: PodSettings, owner_uid: str | None = None
) -> dict[str, Any]:
    """The Service that gives Indexed Job pods their stable DNS names.

    `owner_uid` is the created Job's uid: the Service is then garbage-collected with the Job."""
    metadata: dict[str, Any] = {
        "name": service_name(job),
        "namespace": settings.namespace,
        "labels": _labels(job, settings),
    }
    if owner_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job.name,
                "uid": owner_uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: job.name},
            # Pods have no readiness probe and must resolve each other while starting.
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": "rdzv",
                    "port": settings.rendezvous_port,
                    "targetPort": settings.rendezvous_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_manifests(
    job: TrainingJob, settings: PodSettings, pipes_env: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Everything one launch creates, in creation order."""
    manifests = [build_training_job(job, settings, pipes_env)]
    if job.nnodes > 1:
        manifests.append(build_headless_service(job, settings))
    if job.elastic:
        manifests += build_rendezvous_store(job, settings)
    return manifests


def check_paths_on_shared_volume(config: Mapping[str, Any], settings: PodSettings) -> None:
    """The runtime writes `output_dir` and the checkpoint directory; on Kubernetes both must lie
    on the shared volume, or the results vanish with the pods."""
    root = settings.shared_mount_path.rstrip("/") + "/"
    paths = {"output_dir": config.get("output_dir")}
    checkpoint = config.get("checkpoint")
    if isinstance(checkpoint, Mapping):
        for key in ("dir", "directory", "path"):
            if key in checkpoint:
                paths[f"checkpoint.{key}"] = checkpoint[key]
    for name, value in paths.items():
        if not isinstance(value, str) or not posixpath.normpath(value).startswith(root):
            raise ValueError(
                f"training config {name}={value!r} is not on the shared volume: on Kubernetes "
                f"set it under {root} (the PVC '{settings.shared_claim}' mounted in both the "
                "step pod and the training pods)."
            )


def config_json(config: Mapping[str, Any]) -> str:
    """The bytes written to `config_path`: stable key order so reruns diff cleanly."""
    return json.dumps(config, indent=2, sort_keys=True)

