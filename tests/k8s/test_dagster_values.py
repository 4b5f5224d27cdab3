"""helm/dagster-values.yaml against the official Dagster chart's values keys.

The chart cannot be downloaded here, so tests/k8s/dagster_chart_keys.yaml records the keys its
values schema defines (with the source it was read from); every key we set must appear there,
and the settings that matter to the platform must say what the instance file says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "helm" / "dagster-values.yaml"
KEYS = Path(__file__).with_name("dagster_chart_keys.yaml")
INSTANCE = REPO / "helm" / "instance" / "dagster.yaml"


def unknown_keys(values: Any, allowed: Any, path: str = "") -> list[str]:
    """Paths in `values` that the key tree `allowed` does not define."""
    if allowed == "any":
        return []
    if isinstance(allowed, list):
        if not isinstance(values, list):
            return [f"{path} (expected a list)"]
        return [p for i, item in enumerate(values) for p in unknown_keys(item, allowed[0], f"{path}[{i}]")]
    if isinstance(allowed, dict):
        if not isinstance(values, dict):
            return [f"{path} (expected a mapping)"]
        out = []
        for key, value in values.items():
            where = f"{path}.{key}" if path else key
            if key not in allowed:
                out.append(where)
            else:
                out += unknown_keys(value, allowed[key], where)
        return out
    raise AssertionError(f"bad key tree at {path}: {allowed!r}")


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def test_every_key_exists_in_the_chart(values):
    assert unknown_keys(values, yaml.safe_load(KEYS.read_text())) == []


def test_key_check_catches_typos(values):
    allowed = yaml.safe_load(KEYS.read_text())
    broken = {**values, "runLauncher": {"type": "K8sRunLauncher",
                                        "config": {"k8sRunLauncher": {"jobNamespce": "x"}}}}
    assert unknown_keys(broken, allowed) == ["runLauncher.config.k8sRunLauncher.jobNamespce"]
    item = {"dagster-user-deployments": {"deployments": [{"name": "a", "imag": {}}]}}
    assert unknown_keys(item, allowed) == ["dagster-user-deployments.deployments[0].imag"]


def test_structure_selects_what_the_platform_needs(values):
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    # The queue plus who launched each run (pipelines/run_coordinator.py), in the webserver and the
    # daemon, which therefore run the code location's image.
    assert coordinator["enabled"] and coordinator["type"] == "CustomRunCoordinator"
    custom = coordinator["config"]["customRunCoordinator"]
    assert (custom["module"], custom["class"]) == ("pipelines.run_coordinator", "IdentityRunCoordinator")
    image = values["dagster-user-deployments"]["deployments"][0]["image"]["repository"]
    assert values["dagsterWebserver"]["image"]["repository"] == values["dagsterDaemon"]["image"]["repository"] == image
    assert values["ingress"] == {"enabled": False}  # the UI's way in is the auth proxy's Ingress
    assert values["computeLogManager"]["type"] == "S3ComputeLogManager"
    assert values["computeLogManager"]["config"]["s3ComputeLogManager"]["bucket"]
    assert values["telemetry"] == {"enabled": False}
    assert values["dagsterDaemon"]["runMonitoring"]["enabled"] is True
    assert values["dagsterDaemon"]["runRetries"]["enabled"] is True
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "pipelines.definitions"]
    assert {"name": "model-factory-platform"} in deployment["envConfigMaps"]


def test_no_secret_values(values):
    assert "postgresqlPassword" not in values["postgresql"]
    assert values["generatePostgresqlPasswordSecret"] is False
    assert values["global"]["postgresqlSecretName"]
    text = VALUES.read_text()
    for needle in ("AWS_SECRET_ACCESS_KEY:", "password:", "secretKey:"):
        assert needle not in text


def test_pods_run_as_non_root_without_privilege_escalation(values):
    for section in (values["dagsterWebserver"], values["dagsterDaemon"],
                    values["dagster-user-deployments"]["deployments"][0]):
        assert section["podSecurityContext"]["runAsNonRoot"] is True
        assert section["securityContext"]["allowPrivilegeEscalation"] is False
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert launcher["securityContext"]["allowPrivilegeEscalation"] is False
    assert launcher["runK8sConfig"]["podSpecConfig"]["securityContext"]["runAsNonRoot"] is True


def test_shared_volume_reaches_runs_once(values):
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in launcher["volumes"]] == ["model-factory-shared"]
    assert launcher["volumeMounts"][0]["mountPath"] == "/mnt/training"
    # Also on the user deployment, includeConfigInLaunchedRuns would add it a second time.
    assert "volumes" not in values["dagster-user-deployments"]["deployments"][0]


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def test_chart_values_and_instance_file_agree(values):
    """helm/instance/dagster.yaml (non-Helm deployments, and the Postgres test) says the same."""
    instance = yaml.safe_load(INSTANCE.read_text())
    # The chart renders a custom coordinator's module, class and config into the instance as written.
    custom = values["dagsterDaemon"]["runCoordinator"]["config"]["customRunCoordinator"]
    assert instance["run_coordinator"] == custom
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert instance["run_monitoring"] == {_snake(k): v for k, v in monitoring.items()}
    retries = values["dagsterDaemon"]["runRetries"]
    assert instance["run_retries"] == {_snake(k): v for k, v in retries.items()}
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    k8s = instance["run_launcher"]["config"]
    assert k8s["env_config_maps"] == [e["name"] for e in launcher["envConfigMaps"]]
    assert k8s["env_secrets"] == [e["name"] for e in launcher["envSecrets"]]
    assert k8s["volumes"] == launcher["volumes"] and k8s["volume_mounts"] == launcher["volumeMounts"]
    assert instance["storage"]["postgres"]["postgres_db"]["scheme"] == values["postgresql"]["postgresqlScheme"]
    assert instance["telemetry"] == values["telemetry"]


def test_queue_limits_key_on_the_tags_runs_carry(values):
    from pipelines.automation import MODEL_TAG, TEAM_TAG, TRIGGER_TAG, run_tags
    from pipelines.models.digits import digits_pipeline

    limits = values["dagsterDaemon"]["runCoordinator"]["config"]["customRunCoordinator"]["config"]["tag_concurrency_limits"]
    assert {lim["key"] for lim in limits} == {MODEL_TAG, TEAM_TAG, TRIGGER_TAG}
    ad_hoc = run_tags(digits_pipeline, "ad_hoc")
    assert any(lim["key"] == TRIGGER_TAG and lim["value"] == ad_hoc[TRIGGER_TAG] for lim in limits)
    assert all(lim["key"] in ad_hoc for lim in limits)
