"""The one switch: ``PLATFORM_PROFILE`` chooses local (embedded defaults) or Kubernetes.

Everything else reaches the code as resources and config built here; no other module reads
the environment to decide where it runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import dagster as dg

from resources.platform import (
    ArtifactStoreResource,
    PlatformSettings,
    TrainingLauncherResource,
    VersionedStoreResource,
)

PROFILES = ("local", "kubernetes")
REPO_ROOT = Path(__file__).resolve().parents[1]
# The platform's local instance config (run queue, per-model and per-team limits, run retries, the
# GPU pool); the CLI writes a copy into a DAGSTER_HOME that has none (ensure_instance_config).
LOCAL_INSTANCE_CONFIG = REPO_ROOT / "dagster_home" / "dagster.yaml"
# Run links (PlatformSettings.ui_url): this variable when set, else where dagster-webserver serves by
# the variables it reads itself (``dagster dev`` passes them on), else ``make ui``'s address.
UI_URL_ENV = "DAGSTER_UI_URL"
WEBSERVER_ENV = ("DAGSTER_WEBSERVER_HOST", "DAGSTER_WEBSERVER_PORT", "DAGSTER_WEBSERVER_PATH_PREFIX")
DEFAULT_UI_HOST, DEFAULT_UI_PORT = "127.0.0.1", 3000
# Live TensorBoard links (PlatformSettings.tensorboard_url) on either profile: `make ui` sets it to the
# TensorBoard it starts (pipelines/local_ui.py), the chart's ConfigMap to the one it deploys; unset, no links.
TENSORBOARD_URL_ENV = "TENSORBOARD_URL"
# Failure alerts (pipelines/alerts.py) go to this webhook when the environment sets it, on either
# profile; on Kubernetes it comes from the optional Secret named in helm/dagster-values.yaml.
ALERT_WEBHOOK_ENV = "MODEL_FACTORY_ALERT_WEBHOOK_URL"


@dataclass(frozen=True)
class Profile:
    name: str
    data_root: Path
    # Whether ALERT_WEBHOOK_ENV is set. Its value is read through EnvVar: a Slack webhook URL
    # carries a token, and the UI then shows the variable's name, never the URL.
    alert_webhook: bool = False
    # GPUs in the instance's pool "gpu" when its dagster.yaml sets them (concurrency: pools:
    # default_limit), else None: a sweep whose parallel trials need more is refused when definitions load.
    gpu_pool: int | None = None
    # Base URL of the web UI for run links (local profile; Kubernetes reads DAGSTER_UI_URL in the pods).
    ui_url: str = f"http://{DEFAULT_UI_HOST}:{DEFAULT_UI_PORT}"
    # Folders the code location imports its own code from (pipelines.api.team_definitions finds
    # them): local training workers get them first on PYTHONPATH, so a team package outside the
    # repository imports in every rank. Pods import team code from the training image instead.
    code_paths: tuple[str, ...] = ()
    # Base URL of the TensorBoard over the artifact store (local profile; Kubernetes reads it in the pods).
    tensorboard_url: str | None = None

    @classmethod
    def from_environment(cls) -> "Profile":
        name = os.environ.get("PLATFORM_PROFILE", "local")
        if name not in PROFILES:
            raise ValueError(f"PLATFORM_PROFILE={name!r} is not a profile; use one of {', '.join(PROFILES)}")
        alerts = bool(os.environ.get(ALERT_WEBHOOK_ENV))
        home = Path(os.environ.get("DAGSTER_HOME") or REPO_ROOT / "dagster_home")
        pool = instance_gpu_pool(home)
        if name == "kubernetes":
            # Checkpoints and outputs live on the shared volume every step and training pod mounts.
            return cls(name=name, data_root=Path(os.environ.get("MODEL_FACTORY_SHARED_MOUNT", "/mnt/training")),
                       alert_webhook=alerts, gpu_pool=pool)
        # Local state lives beside the Dagster instance, so a temporary DAGSTER_HOME isolates it too.
        return cls(name=name, data_root=home / "platform", alert_webhook=alerts, gpu_pool=pool,
                   ui_url=served_ui_url(os.environ), tensorboard_url=served_tensorboard_url(os.environ))

    def alert_webhook_url(self) -> str | None:
        return dg.EnvVar(ALERT_WEBHOOK_ENV) if self.alert_webhook else None

    def resources(self) -> dict[str, dg.ConfigurableResource]:
        if self.name == "local":
            root = str(self.data_root)
            return {
                "platform": PlatformSettings(data_root=root, ui_url=self.ui_url, tensorboard_url=self.tensorboard_url,
                                             alert_webhook_url=self.alert_webhook_url()),
                "store": VersionedStoreResource(kind="local", local_root=str(self.data_root / "store")),
                "artifacts": ArtifactStoreResource(kind="local", local_root=str(self.data_root / "artifacts")),
                "launcher": TrainingLauncherResource(kind="local", work_root=str(self.data_root / "launches"),
                                                     python_path=list(self.code_paths)),
            }
        return kubernetes_resources(self.data_root, self.alert_webhook_url(), environ=os.environ)

    def executor(self) -> dg.ExecutorDefinition:
        if self.name == "local":
            return LOCAL_EXECUTOR
        from dagster_k8s import k8s_job_executor

        from resources.k8s.step_config import k8s_executor_config, platform_settings

        # The chart's ConfigMap (helm/model-factory) provides these settings to the Dagster pods.
        settings = platform_settings(os.environ)
        return k8s_job_executor.configured(k8s_executor_config(settings, runner_service_account="dagster"))

    def store(self):
        return self.resources()["store"].get()


# The local profile's executor: Dagster's own in-process or multiprocess executor, chosen by a run's
# config. In process by default: most steps are light orchestration (the heavy work runs in
# torchrun workers, or in a step's own worker pool), and it saves ~2 s of process start per step
# (measured in shared/FACTS.md). A run whose data is sharded over steps (a table's or a corpus's
# groups of parts) may ask for ``execution: {config: {multiprocess: {max_concurrent: N}}}`` to run
# N groups at once, a process each (docs/datasets-beyond-one-node.md).
LOCAL_EXECUTOR = dg.multi_or_in_process_executor.configured(
    lambda config: config, name="local_executor",
    config_schema=dg.Field(dg.multi_or_in_process_executor.config_schema.config_type,
                           default_value={"in_process": {}}, is_required=False),
    description="In process by default; `multiprocess: {max_concurrent: N}` runs N steps at once, a process each.")


def served_ui_url(environ: Mapping[str, str]) -> str:
    """Where the web UI answers, for run links: ``DAGSTER_UI_URL`` when set (a proxy, another host);
    else the host, port and path prefix dagster-webserver itself serves on when ``dagster dev`` or
    ``dagster-webserver`` is started without ``-h``/``-p`` (DAGSTER_WEBSERVER_HOST, _PORT and
    _PATH_PREFIX, which both read); else ``make ui``'s http://127.0.0.1:3000."""
    explicit = (environ.get(UI_URL_ENV) or "").strip()
    if explicit:
        if not explicit.startswith(("http://", "https://")):
            raise ValueError(f"{UI_URL_ENV}={explicit!r} is not an http(s) URL; set it to the address the web UI "
                             "answers on, e.g. http://127.0.0.1:3000")
        return explicit.rstrip("/")
    host_env, port_env, prefix_env = WEBSERVER_ENV
    host = (environ.get(host_env) or DEFAULT_UI_HOST).strip()
    # Bound to every address, the UI is reached on this machine through the loopback address.
    host = DEFAULT_UI_HOST if host in ("0.0.0.0", "::", "") else host
    port = (environ.get(port_env) or str(DEFAULT_UI_PORT)).strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{port_env}={port!r} is not a port number; set it to the port dagster-webserver serves on")
    prefix = (environ.get(prefix_env) or "").strip().strip("/")
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{int(port)}" + (f"/{prefix}" if prefix else "")


def served_tensorboard_url(environ: Mapping[str, str]) -> str | None:
    """The TensorBoard that runs link their live curves to: ``TENSORBOARD_URL``, or
    None when it is unset (nothing serves the event files, so no link is given)."""
    url = (environ.get(TENSORBOARD_URL_ENV) or "").strip()
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{TENSORBOARD_URL_ENV}={url!r} is not an http(s) URL; set it to the address TensorBoard "
                         "answers on, e.g. http://127.0.0.1:6006, or unset it")
    return url.rstrip("/")


def ensure_instance_config(home: Path) -> bool:
    """Write the platform's local instance config into ``home`` when it has no dagster.yaml (creating
    ``home``); True when it wrote one. An existing dagster.yaml is never touched."""
    target = home / "dagster.yaml"
    if target.exists():
        return False
    home.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".dagster.yaml.{os.getpid()}.tmp")
    tmp.write_text(LOCAL_INSTANCE_CONFIG.read_text())
    tmp.replace(target)  # atomic: a concurrent reader sees the whole file or none
    return True


def instance_gpu_pool(home: Path) -> int | None:
    """``concurrency: pools: default_limit`` of the instance's dagster.yaml, if it sets one (the
    limit `dagster instance concurrency set gpu N` stores in the database is not known here)."""
    import yaml

    try:
        config = yaml.safe_load((home / "dagster.yaml").read_text()) or {}
    except FileNotFoundError:
        return None
    limit = ((config.get("concurrency") or {}).get("pools") or {}).get("default_limit")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def kubernetes_resources(shared_root: Path, alert_webhook_url: str | None = None, *,
                         environ: Mapping[str, str]) -> dict[str, dg.ConfigurableResource]:
    """Production: lakeFS, S3, GPU pods; settings and secrets come from the deployment's env
    (Secrets by reference, read through EnvVar so the UI shows names, never values).

    The training launcher carries the chart ConfigMap's settings as `platform_settings(environ)`
    reads them, the same call that shapes the step pods (Profile.executor): one configuration path
    for step and training pods. A missing setting fails here, when definitions load."""
    from resources.k8s.step_config import platform_environ

    return {
        "platform": PlatformSettings(data_root=str(shared_root), ui_url=dg.EnvVar(UI_URL_ENV),
                                     tensorboard_url=served_tensorboard_url(environ),
                                     alert_webhook_url=alert_webhook_url),
        "store": VersionedStoreResource(
            kind="lakefs", repository=dg.EnvVar("LAKEFS_REPOSITORY"), lakefs_endpoint=dg.EnvVar("LAKEFS_ENDPOINT"),
            lakefs_access_key_id=dg.EnvVar("LAKEFS_ACCESS_KEY_ID"),
            lakefs_secret_access_key=dg.EnvVar("LAKEFS_SECRET_ACCESS_KEY"),
        ),
        "artifacts": ArtifactStoreResource(kind="s3", bucket=dg.EnvVar("ARTIFACT_BUCKET"), prefix="artifacts"),
        "launcher": TrainingLauncherResource(
            kind="kubernetes", work_root=str(shared_root), cluster_settings=platform_environ(environ),
        ),
    }
