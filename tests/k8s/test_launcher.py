"""KubernetesTrainingLauncher as the orchestrator builds it (pipelines' TrainingLauncherResource)."""

from __future__ import annotations

import dagster as dg
import pytest

from resources.k8s.launcher import KubernetesTrainingLauncher, launcher_kwargs
from resources.k8s.step_config import platform_settings
from resources.launch.base import TrainingLauncher
from tests.k8s.helpers import make_job, validate_all


def test_orchestrator_resource_builds_the_kubernetes_launcher():
    from resources.platform import TrainingLauncherResource

    launcher = TrainingLauncherResource(
        kind="kubernetes", work_root="/mnt/training",
        cluster_settings={"TRAINING_NAMESPACE": "model-factory", "MODEL_FACTORY_SHARED_CLAIM": "model-factory-shared",
                          "MODEL_FACTORY_S3_SECRET": "model-factory-s3"},
        image="registry.example.com/model-factory/training:abc",
    ).get()
    assert isinstance(launcher, KubernetesTrainingLauncher) and isinstance(launcher, TrainingLauncher)
    settings = launcher.pod_settings()
    assert settings.shared_mount_path == "/mnt/training"
    assert settings.service_account == "model-factory-training"
    assert {s.secret for s in settings.secret_env} == {"model-factory-s3"}
    validate_all([launcher_manifest(launcher)])


def launcher_manifest(launcher: KubernetesTrainingLauncher) -> dict:
    from resources.k8s.manifests import build_training_job

    return build_training_job(make_job(nproc=2), launcher.pod_settings())


def test_missing_image_names_the_variable():
    with pytest.raises(ValueError, match="TRAINING_IMAGE"):
        KubernetesTrainingLauncher.from_settings(namespace="ns", image=None, work_root="/mnt/training")


def test_launcher_is_a_configurable_resource_with_env_vars(monkeypatch):
    monkeypatch.setenv("TRAINING_NAMESPACE", "model-factory")
    monkeypatch.setenv("TRAINING_IMAGE", "registry.example.com/model-factory/training:env")

    @dg.asset
    def probe(launcher: KubernetesTrainingLauncher) -> str:
        """Reports the namespace and image the resource resolved."""
        return f"{launcher.namespace} {launcher.image}"

    result = dg.materialize([probe], resources={"launcher": KubernetesTrainingLauncher(
        namespace=dg.EnvVar("TRAINING_NAMESPACE"), image=dg.EnvVar("TRAINING_IMAGE"))})
    assert result.output_for_node("probe") == "model-factory registry.example.com/model-factory/training:env"


def test_launcher_kwargs_round_trip_the_chart_settings():
    environ = {"TRAINING_NAMESPACE": "ml", "TRAINING_IMAGE": "img:1", "MODEL_FACTORY_SHARED_CLAIM": "shared",
               "MODEL_FACTORY_S3_SECRET": "creds", "MODEL_FACTORY_SHARED_MOUNT": "/mnt/training"}
    settings = platform_settings(environ)
    launcher = KubernetesTrainingLauncher(**launcher_kwargs(settings))
    assert launcher.pod_settings() == settings


def test_in_cluster_config_outside_a_pod_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    launcher = KubernetesTrainingLauncher(namespace="ns", image="img")
    with pytest.raises(RuntimeError, match="load_incluster_config=False"):
        launcher._client()
