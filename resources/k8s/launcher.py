"""KubernetesTrainingLauncher: the TrainingLauncher that runs `torchrun` in GPU pods.

One node or several, a launch is one Indexed Job (plus a headless Service for several, and a
rendezvous store pod for an elastic gang). In a fixed gang rank 0 always lives in pod 0; its logs
carry the Dagster Pipes messages, read with dagster-k8s's `PipesK8sPodLogsMessageReader`. An
elastic gang's rank 0 moves when pod 0 is lost, so its messages go through a file on the shared
volume instead. We do not use `PipesK8sClient.run` itself: it creates a bare
Pod (no TTL, no owner for a Service), and waits up to five hours for a Pending pod, where we
need the scheduler's reason after a configurable time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import dagster as dg
from dagster import PipesEnvContextInjector, open_pipes_session
from dagster_k8s import PipesK8sPodLogsMessageReader
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from pydantic import Field

from resources.k8s.client import TrainingJobClient, TrainingJobFailed
from resources.k8s.fabric import rdma_profile, rdma_settings
from resources.k8s.feasibility import check_feasibility
from resources.k8s.kueue import kueue_keys, kueue_settings, scheduler_name
from resources.k8s.manifests import (
    PodSettings,
    build_manifests,
    check_paths_on_shared_volume,
    config_json,
    config_path,
    rdma_for,
    validate_job,
    with_run_priority,
)
from resources.k8s.step_config import lakefs_secret_env, s3_secret_env
from resources.launch.base import TrainingJob, TrainingLauncher
from resources.launch.durable_messages import LiveDurableFileMessageReader, catch_up, messages_file
from resources.launch.live_telemetry import ForwardsTrainingMessages
from resources.launch.rank_logs import WORKER_LOG_DIR, new_launch_dir
from training_runtime.atomic_files import atomic_write_bytes
from training_runtime.observe.attempts import attempts_root, launch_outcome
from training_runtime.observe.build_info import EXPECTED_CODE_VERSION_ENV


class LivePodLogsMessageReader(ForwardsTrainingMessages, PipesK8sPodLogsMessageReader):
    """Pod 0's log reader; telemetry and detections show in Dagster while the pods train."""


def run_training_job(
    context: dg.AssetExecutionContext | dg.OpExecutionContext,
    client: TrainingJobClient,
    job: TrainingJob,
    settings: PodSettings,
    *,
    check_nodes: bool = True,
    expected_code_version: Mapping[str, Any] | None = None,
) -> dg.PipesClientCompletedInvocation:
    """Validate, check feasibility, replace an earlier attempt's Job, write the config, run the
    Job under a Pipes session. ``expected_code_version`` (core.code_version's dict) goes to the
    pods, which fail unless their image's BUILD.json records the same; None: no check."""
    validate_job(job)
    check_paths_on_shared_volume(job.config, settings)
    if check_nodes:
        rdma = rdma_for(job, settings)
        fitting = check_feasibility(job.gpu, client.list_nodes(), rdma.resources() if rdma else None)
        context.log.info(f"{len(fitting)} node(s) can hold a pod of {job.name}")
    namespace = settings.namespace
    # Before this attempt writes anything: an earlier attempt's Job (same name, same checkpoint
    # directory) is deleted and its pods waited out; see TrainingJobClient.replace_previous.
    client.replace_previous(job.name, namespace, say=context.log.warning)
    path = Path(config_path(job, settings))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written through the step pod's mount of the same PVC the training pods mount.
    path.write_text(config_json(job.config))
    if job.elastic:
        # Rank 0 moves to another pod when pod 0 is lost: the messages go to a file on the shared
        # volume (the step pod mounts it at the same path), read as the local launcher reads them,
        # and a retry first reports what a killed step never read.
        work_dir = Path(job.config["checkpoint"]["dir"]).parent
        catch_up(context, work_dir)
        launch = f"k8s-launch_{job.config.get('launch', 1)}"  # the orchestrator counts its launches
        reader = LiveDurableFileMessageReader(messages_file(work_dir, launch), context=context)
    else:
        reader = LivePodLogsMessageReader(context=context)
    with open_pipes_session(
        context=context,
        context_injector=PipesEnvContextInjector(),
        message_reader=reader,
        extras={"training_job": job.name, "nnodes": job.nnodes},
    ) as session:
        env = dict(session.get_bootstrap_env_vars())
        if expected_code_version is not None:
            env[EXPECTED_CODE_VERSION_ENV] = json.dumps(dict(expected_code_version), sort_keys=True)
        manifests = build_manifests(job, settings, env)
        keep_logs = pod_log_keeper(context, client, namespace, pod_log_root(job, settings))
        with client.launched(manifests, before_delete=keep_logs) as name:
            context.log.info(
                f"launched Job {namespace}/{name}: {job.nnodes} pod(s) x "
                f"{job.nproc_per_node} process(es)"
            )
            if job.elastic:  # it starts with what is admitted, at least min_nodes pods
                client.wait_started(name, namespace, job.min_nodes, others_may_wait=True)
            else:
                pods = client.wait_started(name, namespace, job.nnodes)
                rank0 = client.pod_for_index(pods, 0)
                # Follows pod 0's log until its container exits; Pipes lines become events,
                # everything else goes to this step's stdout (and the compute log).
                reader.consume_pod_logs(
                    context=context,
                    core_api=client.core_api,
                    pod_name=rank0.metadata.name,
                    namespace=namespace,
                )
            try:
                client.wait_finished(name, namespace)
            except TrainingJobFailed as exc:
                raise with_training_account(exc, job) from exc
            # While the pods exist: their status has the digest each node ran.
            record_image_digests(context, client.image_ids(name, namespace), Path(job.config["output_dir"]))
    return dg.PipesClientCompletedInvocation(session)


def with_training_account(exc: TrainingJobFailed, job: TrainingJob) -> TrainingJobFailed:
    """The Job's failure with the training's own account of it: the attempt records the ranks
    left beside the checkpoints on the shared volume (training_runtime/observe/attempts.py), which
    say why in the runtime's words and whether a new attempt can fix it. The pods' termination
    messages hold only their logs' tails, which after a failure that stops torchrun's agent end
    with the agent's own exit."""
    outcome = launch_outcome(attempts_root(job.config["checkpoint"]["dir"]), int(job.config.get("launch", 1)))
    if outcome is None:
        return exc
    name = (outcome.failure or {}).get("exception")
    what = f"{name}: {outcome.message}" if name and not outcome.message.startswith(name) else outcome.message
    retry = "not retried: a new attempt would fail the same way" if outcome.deterministic else "a retry may fix it"
    return TrainingJobFailed(f"{exc}\nthe training's own account ({retry}): {what}")


def image_digest(image_id: str) -> str:
    """``sha256:...`` of a container status imageID (``docker-pullable://reg/img@sha256:...``,
    ``reg/img@sha256:...`` or a bare ``sha256:...``, as container runtimes differ)."""
    _, at, digest = image_id.rpartition("@")
    digest = digest if at else image_id.rpartition("://")[2]
    if not digest.startswith("sha256:"):
        raise ValueError(f"container imageID {image_id!r} carries no sha256 digest")
    return digest


def record_image_digests(
    context: dg.AssetExecutionContext | dg.OpExecutionContext, image_ids: Mapping[str, str], output_dir: Path
) -> None:
    """Add the digests the pods ran to resolved_config.json's ``pod`` section. Only the pod status
    knows them (a container cannot see its own digest); a tag that moved between two nodes' pulls
    shows as two digests, and a warning."""
    resolved_path = output_dir / "resolved_config.json"
    if not resolved_path.exists():
        return  # the training wrote no outputs: the step's own check fails it and says so
    resolved = json.loads(resolved_path.read_text())
    if "pod" not in resolved:
        raise RuntimeError(f"{resolved_path} has no 'pod' section: the training image predates pod lineage; "
                           "rebuild it from helm/images/training.Dockerfile")
    digests = sorted({image_digest(i) for i in image_ids.values()})
    if len(digests) > 1:
        context.log.warning(f"the training pods ran different images {digests} under one tag: pin the "
                            "image by digest or use immutable tags")
    resolved["pod"]["image_digests"] = digests
    # Atomic and durable, as the runtime writes it: the step reads it right after.
    atomic_write_bytes(resolved_path, (json.dumps(resolved, indent=2, sort_keys=True) + "\n").encode())


def pod_log_root(job: TrainingJob, settings: PodSettings) -> Path:
    """Where the step keeps a Job's pod logs: beside the launch's config, on the shared volume that
    the step pod mounts at the same path as the training pods."""
    return Path(config_path(job, settings)).parent / WORKER_LOG_DIR


def pod_log_keeper(
    context: dg.AssetExecutionContext | dg.OpExecutionContext,
    client: TrainingJobClient,
    namespace: str,
    root: Path,
) -> Callable[[str], None]:
    """What `client.launched` runs before it deletes the Job: every pod's log (all containers, a
    restarted one's previous run too) into the next `root/launch_<k>/<pod>/<container>.log`. The
    pod logs die with the pods, and pod 0's is the only one the Pipes reader streams."""

    def keep(name: str) -> None:
        try:
            logs = client.container_logs(name, namespace)
            if not logs:
                context.log.info(f"Job {namespace}/{name} left no container logs (no container started)")
                return
            launch_dir = new_launch_dir(root)
            for relative, data in logs.items():
                path = launch_dir / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        except Exception as exc:
            # The logs are evidence: failing to keep them must not mask the launch's own outcome.
            context.log.warning(f"could not keep the pod logs of Job {namespace}/{name}: {exc!r}")
            return
        context.log.info(f"kept {len(logs)} container log(s) of Job {namespace}/{name} in {launch_dir}")

    return keep


class KubernetesTrainingLauncher(dg.ConfigurableResource, TrainingLauncher):
    """Runs training as an Indexed Job of GPU pods in the training namespace."""

    namespace: str = Field(description="Training namespace (helm/model-factory creates it).")
    image: str = Field(description="Training image (helm/images/training.Dockerfile).")
    service_account: str = Field(
        default="model-factory-training",
        description="Service account of the training pods (no API permissions).",
    )
    shared_claim: str = Field(
        default="model-factory-shared",
        description="ReadWriteMany PVC for configs, checkpoints and outputs.",
    )
    shared_mount_path: str = Field(
        default="/mnt/training",
        description="Mount path of the shared PVC, identical in step and training pods.",
    )
    s3_secret: str | None = Field(
        default="model-factory-s3",
        description="Secret with AWS_* keys for s3:// data, by name (helm/model-factory's "
        "secrets.s3.trainingName, the training key); None: pods get no AWS credentials.",
    )
    image_pull_secrets: list[str] = Field(default_factory=list)
    cluster_domain: str = Field(default="cluster.local")
    pending_timeout_s: float = Field(
        default=600.0, description="Fail when a pod is still Pending after this many seconds."
    )
    poll_interval_s: float = Field(default=5.0)
    deletion_timeout_s: float = Field(
        default=300.0,
        description="How long a retry waits for an earlier attempt's Job and pods to be deleted before "
        "it fails (it never starts a second Job on the same checkpoints).",
    )
    ttl_seconds_after_finished: int = Field(default=3600)
    check_feasibility: bool = Field(
        default=True, description="List nodes and fail at once if the GPU request cannot fit."
    )
    load_incluster_config: bool = Field(
        default=True, description="False: use kubeconfig_file (or ~/.kube/config)."
    )
    kubeconfig_file: str | None = None
    rdma: dict[str, str] = Field(
        default_factory=dict,
        description="The MODEL_FACTORY_RDMA_* keys of the model-factory chart's ConfigMap (its "
        "training.rdma values): NCCL over InfiniBand/RoCE for multi-node Jobs. Empty: TCP.",
    )
    lakefs_secret: str | None = Field(
        default="model-factory-lakefs",
        description="Secret with LAKEFS_ACCESS_KEY_ID / LAKEFS_SECRET_ACCESS_KEY (the chart's "
        "secrets.lakefs.trainingName): pods reading shards through lakeFS's S3 gateway use these keys.",
    )
    training_priority_class: str | None = Field(
        default=None, description="PriorityClass of scheduled and new-data runs' pods (chart: priorityClasses.training)."
    )
    adhoc_priority_class: str | None = Field(
        default=None, description="PriorityClass of ad-hoc runs' pods (chart: priorityClasses.adhoc)."
    )

    kueue: dict[str, str] = Field(
        default_factory=dict,
        description="The MODEL_FACTORY_KUEUE_* and priority-class keys of the model-factory chart's "
        "ConfigMap (its kueue values): Jobs start suspended in the team's Kueue LocalQueue. Empty: off.",
    )
    scheduler_name: str | None = Field(
        default=None, description="The chart's bin-packing scheduler (binPackingScheduler); None: the default."
    )

    @classmethod
    def from_settings(
        cls,
        *,
        namespace: str,
        image: str | None,
        work_root: str,
        service_account: str | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> "KubernetesTrainingLauncher":
        """Build from the orchestrator's TrainingLauncherResource fields; `work_root` is the
        shared volume's mount path (configs, checkpoints and outputs live under it). The RDMA
        profile comes from `environ` (default: this process's environment, which the chart's
        ConfigMap fills in the Dagster pods)."""
        if not image:
            raise ValueError(
                "no training image: set TRAINING_IMAGE (the model-factory chart's ConfigMap "
                "does) to the image built from helm/images/training.Dockerfile."
            )
        return cls(
            namespace=namespace,
            image=image,
            shared_mount_path=work_root,
            service_account=service_account or "model-factory-training",
            **{"rdma": rdma_settings(os.environ if environ is None else environ),
               "kueue": kueue_keys(os.environ if environ is None else environ),
               "scheduler_name": scheduler_name(os.environ if environ is None else environ), **overrides},
        )

    def pod_settings(self) -> PodSettings:
        return PodSettings(
            namespace=self.namespace,
            image=self.image,
            service_account=self.service_account,
            shared_claim=self.shared_claim,
            shared_mount_path=self.shared_mount_path,
            secret_env=s3_secret_env(self.s3_secret) if self.s3_secret else (),
            image_pull_secrets=tuple(self.image_pull_secrets),
            cluster_domain=self.cluster_domain,
            ttl_seconds_after_finished=self.ttl_seconds_after_finished,
            rdma=rdma_profile(self.rdma),
            kueue=kueue_settings(self.kueue),
            scheduler_name=self.scheduler_name,
            training_priority_class=self.training_priority_class,
            adhoc_priority_class=self.adhoc_priority_class,
            lakefs_secret_env=lakefs_secret_env(self.lakefs_secret) if self.lakefs_secret else (),
        )

    def _client(self) -> TrainingJobClient:
        if self.load_incluster_config:
            if not os.environ.get("KUBERNETES_SERVICE_HOST"):
                raise RuntimeError(
                    "load_incluster_config=True but this process is not in a pod; set "
                    "load_incluster_config=False (and kubeconfig_file) to launch from outside."
                )
            k8s_config.load_incluster_config()
        else:
            k8s_config.load_kube_config(config_file=self.kubeconfig_file)
        return TrainingJobClient(
            k8s_client.BatchV1Api(),
            k8s_client.CoreV1Api(),
            poll_interval_s=self.poll_interval_s,
            pending_timeout_s=self.pending_timeout_s,
            deletion_timeout_s=self.deletion_timeout_s,
        )

    def log_dir(self, job: TrainingJob) -> Path:
        return pod_log_root(job, self.pod_settings())

    def launch(
        self, context: dg.AssetExecutionContext | dg.OpExecutionContext, job: TrainingJob
    ) -> dg.PipesClientCompletedInvocation:
        return run_training_job(
            context,
            self._client(),
            # The run's origin (schedule, sensor or by hand) picks the chart's priority class.
            with_run_priority(job, self.pod_settings(), context.run.tags),
            self.pod_settings(),
            check_nodes=self.check_feasibility,
            expected_code_version=job.code_version,
        )


def launcher_kwargs(settings: PodSettings) -> dict[str, Any]:
    """KubernetesTrainingLauncher(**launcher_kwargs(platform_settings(os.environ)))."""
    s3 = {s.secret for s in settings.secret_env}
    return {
        "namespace": settings.namespace,
        "image": settings.image,
        "service_account": settings.service_account,
        "shared_claim": settings.shared_claim,
        "shared_mount_path": settings.shared_mount_path,
        "s3_secret": next(iter(s3)) if s3 else None,
        "image_pull_secrets": list(settings.image_pull_secrets),
        "cluster_domain": settings.cluster_domain,
        "rdma": settings.rdma.to_environ() if settings.rdma else {},
        "kueue": settings.kueue.to_environ() if settings.kueue else {},
        "scheduler_name": settings.scheduler_name,
        "lakefs_secret": next(iter({s.secret for s in settings.lakefs_secret_env}), None),
        "training_priority_class": settings.training_priority_class,
        "adhoc_priority_class": settings.adhoc_priority_class,
    }
