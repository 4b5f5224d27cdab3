"""Dagster resources: thin, configurable wrappers that build the platform's backends.

Each resource shows its settings in the UI and hands out the plain backend object, so asset
bodies never know which environment they run in.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from resources.artifacts.base import ArtifactStore
from resources.launch.base import TrainingLauncher
from resources.store.base import VersionedStore


class PlatformSettings(dg.ConfigurableResource):
    """Where local state lives, how to link back to the UI, and where failure alerts go."""

    data_root: str = Field(description="Directory for sources, checkpoints and other local state.")
    ui_url: str = Field(default="http://localhost:3000", description="Base URL of the Dagster web UI, for run links.")
    tensorboard_url: str | None = Field(
        default=None, description="Base URL of the TensorBoard over the artifact store's models/ area (`make ui`'s, "
                                  "the chart's); each training links its live curves there (ops/live_tensorboard.py). "
                                  "None: no links.")
    # A Slack incoming-webhook URL carries its token in the path: pass it as an EnvVar so the UI
    # shows the variable's name, never the URL (pipelines/profiles.py does).
    alert_webhook_url: str | None = Field(
        default=None, description="Webhook that run-failure alerts are POSTed to (Slack-style JSON); "
                                  "unset: no alerts are sent (pipelines/alerts.py).")

    @property
    def root(self) -> Path:
        return Path(self.data_root).resolve()

    @property
    def sources_root(self) -> Path:
        return self.root / "sources"

    @property
    def checkpoints_root(self) -> Path:
        return self.root / "checkpoints"

    def run_url(self, run_id: str) -> str:
        return f"{self.ui_url.rstrip('/')}/runs/{run_id}"


class VersionedStoreResource(dg.ConfigurableResource):
    """The versioned dataset store: a local directory or lakeFS."""

    kind: str = Field(default="local", description="'local' (embedded default) or 'lakefs'.")
    repository: str = Field(default="model-factory", description="Store repository name.")
    local_root: str | None = Field(default=None, description="Root directory of the local store.")
    lakefs_endpoint: str | None = Field(default=None, description="lakeFS endpoint URL, e.g. http://lakefs:8000.")
    lakefs_access_key_id: str | None = Field(default=None, description="lakeFS access key id.")
    lakefs_secret_access_key: str | None = Field(default=None, description="lakeFS secret (use an EnvVar).")
    lakefs_storage_namespace: str | None = Field(default=None, description="Storage namespace for a new repository.")

    def get(self) -> VersionedStore:
        from resources.store.factory import make_store

        if self.kind == "local":
            if not self.local_root:
                raise dg.DagsterInvariantViolationError("VersionedStoreResource: set local_root for kind='local'")
            return make_store("local", root=Path(self.local_root), repository=self.repository)
        if self.kind == "lakefs":
            return make_store(
                "lakefs",
                endpoint=self.lakefs_endpoint,
                access_key_id=self.lakefs_access_key_id,
                secret_access_key=self.lakefs_secret_access_key,
                repository=self.repository,
                storage_namespace=self.lakefs_storage_namespace,
            )
        raise dg.DagsterInvariantViolationError(
            f"VersionedStoreResource: unknown kind {self.kind!r}; use 'local' or 'lakefs'"
        )


class ArtifactStoreResource(dg.ConfigurableResource):
    """Object storage for checkpoints and weights: local disk or S3."""

    kind: str = Field(default="local", description="'local' or 's3'.")
    local_root: str | None = Field(default=None, description="Directory for kind='local'.")
    bucket: str | None = Field(default=None, description="S3 bucket for kind='s3'.")
    prefix: str = Field(default="", description="Key prefix inside the bucket.")
    endpoint_url: str | None = Field(default=None, description="S3 endpoint (for S3-compatible servers).")
    region: str | None = Field(default=None, description="S3 region.")

    def get(self) -> ArtifactStore:
        from resources.artifacts.factory import make_artifact_store

        if self.kind == "local":
            return make_artifact_store("local", root=Path(self.local_root or "."))
        return make_artifact_store(
            self.kind, bucket=self.bucket, prefix=self.prefix, endpoint_url=self.endpoint_url, region=self.region
        )


class TrainingLauncherResource(dg.ConfigurableResource):
    """Where training workers run: local torchrun or Kubernetes pods."""

    kind: str = Field(default="local", description="'local' (torchrun subprocesses) or 'kubernetes'.")
    work_root: str = Field(description="Directory for launch configs (local) or the shared volume mount (k8s).")
    # One configuration path: the same keys, read by the same platform_settings(), shape the step
    # pods (pipelines/profiles.py's executor) and the training pods built here.
    cluster_settings: dict[str, str] = Field(
        default_factory=dict,
        description="kind='kubernetes': the model-factory-platform ConfigMap's settings (TRAINING_NAMESPACE, "
                    "TRAINING_IMAGE, MODEL_FACTORY_*) that resources.k8s.step_config.platform_settings reads; "
                    "Secret names only, never credentials.")
    image: str | None = Field(default=None, description="Training image; None: cluster_settings' TRAINING_IMAGE.")
    python_path: list[str] = Field(
        default_factory=list,
        description="kind='local': folders put first on the training workers' PYTHONPATH, the code location's "
                    "import roots (pipelines.api.team_definitions finds them), so team code outside the "
                    "repository imports in every rank. Pods import team code from the training image.")

    def get(self) -> TrainingLauncher:
        if self.kind == "local":
            from resources.launch.local import LocalTorchrunLauncher

            return LocalTorchrunLauncher(Path(self.work_root), python_path=self.python_path)
        if self.kind == "kubernetes":
            from resources.k8s.launcher import KubernetesTrainingLauncher, launcher_kwargs
            from resources.k8s.step_config import ENV_SHARED_MOUNT, platform_settings

            settings = platform_settings(self.cluster_settings, image=self.image)
            if settings.shared_mount_path.rstrip("/") != self.work_root.rstrip("/"):
                raise dg.DagsterInvariantViolationError(
                    f"TrainingLauncherResource: work_root {self.work_root!r} is not the shared volume's mount "
                    f"path {settings.shared_mount_path!r} ({ENV_SHARED_MOUNT}); checkpoints written there would "
                    "not reach the training pods. Build the resource with pipelines.profiles.kubernetes_resources."
                )
            return KubernetesTrainingLauncher(**launcher_kwargs(settings))
        raise dg.DagsterInvariantViolationError(
            f"TrainingLauncherResource: unknown kind {self.kind!r}; use 'local' or 'kubernetes'"
        )
