"""The storage keys split by who holds them: the training pods the launcher builds from the chart's
ConfigMap reference only the training keys' Secrets and run as the training service account; the
orchestrator's pods (helm/dagster-values.yaml) hold only the orchestrator's. What each key may do
is enforced by the S3 server (tests/artifacts/test_s3_key_scopes.py shows it on SeaweedFS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from resources.k8s.manifests import build_manifests
from resources.k8s.step_config import platform_settings
from tests.k8s.helpers import make_job, validate_all
from tests.k8s.test_helm import by_kind, render

REPO = Path(__file__).resolve().parents[2]
DAGSTER_VALUES = yaml.safe_load((REPO / "helm" / "dagster-values.yaml").read_text())
TRAINING_SECRETS = {"model-factory-s3-training", "model-factory-lakefs-training"}
ORCHESTRATOR_SECRETS = {"model-factory-s3", "model-factory-lakefs"}


def secret_refs(node: Any) -> Iterator[str]:
    """Every Secret a manifest refers to: secretKeyRef, secretRef (envFrom) and secret volumes."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(value, dict):
                yield value["name"]
            elif key == "secret" and isinstance(value, dict) and "secretName" in value:
                yield value["secretName"]
            else:
                yield from secret_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from secret_refs(item)


def training_pods(settings, lakefs_gateway: bool) -> dict:
    job = make_job()
    if lakefs_gateway:  # shards read through lakeFS's S3 gateway: the lakeFS training key
        job.config["data"] = {"s3_endpoint_url": "https://lakefs.example.com",
                              "locations": {"shards/train/00000.bin": "s3://model-factory/abc123/shards/train/00000.bin"}}
    (manifest,) = build_manifests(job, settings)
    validate_all([manifest])
    return manifest


def test_training_pods_get_only_the_training_keys_and_the_training_service_account():
    (cm,) = by_kind(render(), "ConfigMap")
    settings = platform_settings(cm["data"])
    s3 = training_pods(settings, lakefs_gateway=False)
    gateway = training_pods(settings, lakefs_gateway=True)
    assert set(secret_refs(s3)) == {"model-factory-s3-training"}
    assert set(secret_refs(gateway)) == {"model-factory-lakefs-training"}
    for manifest in (s3, gateway):
        pod = manifest["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "model-factory-training"
        assert pod["automountServiceAccountToken"] is False


def test_the_orchestrators_pods_hold_only_the_orchestrator_keys():
    (deployment,) = DAGSTER_VALUES["dagster-user-deployments"]["deployments"]
    launcher = DAGSTER_VALUES["runLauncher"]["config"]["k8sRunLauncher"]
    held = set(secret_refs(deployment)) | {s["name"] for s in deployment["envSecrets"]} | {
        s["name"] for s in launcher["envSecrets"]}
    assert ORCHESTRATOR_SECRETS <= held and not held & TRAINING_SECRETS
    # Run and step pods run as the Dagster chart's service account, which the launcher Role binds;
    # the training service account is bound to nothing.
    assert DAGSTER_VALUES["global"]["serviceAccountName"] == "dagster"
    docs = render()
    subjects = [s["name"] for b in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
                for s in b["subjects"]]
    assert set(subjects) == {"dagster"}


def test_the_chart_refuses_one_key_for_both():
    with pytest.raises(Exception, match="trainingName must name a Secret other than secrets.s3.name"):
        render({"secrets": {"s3": {"name": "model-factory-s3", "trainingName": "model-factory-s3"},
                            "lakefs": {"name": "model-factory-lakefs", "trainingName": "model-factory-lakefs-training"}}})


def test_a_configmap_from_before_the_split_still_gives_training_pods_the_one_key_it_names():
    (cm,) = by_kind(render(), "ConfigMap")
    old = {k: v for k, v in cm["data"].items() if not k.startswith("MODEL_FACTORY_TRAINING_") or k.endswith(
        ("SERVICE_ACCOUNT", "PRIORITY_CLASS"))}
    settings = platform_settings(old)
    assert {s.secret for s in settings.secret_env} == {"model-factory-s3"}
    assert {s.secret for s in settings.lakefs_secret_env} == {"model-factory-lakefs"}
