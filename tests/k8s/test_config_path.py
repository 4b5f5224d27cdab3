"""One configuration path: the chart's ConfigMap, rendered by the real Helm engine, is the
environment the definitions load with; the training launcher they build reads it through the same
`platform_settings` as the step pods, and every setting shows up in the training Job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.spec import model_pipeline
from ops.training_config import runtime_config, training_job
from resources.k8s.manifests import build_manifests, check_paths_on_shared_volume, config_path, with_run_priority
from resources.k8s.step_config import platform_environ, platform_settings
from tests.k8s.helpers import validate_all
from tests.k8s.test_helm import by_kind, render

NAMESPACE = "ml-team"
MOUNT = "/mnt/team"
# A value for every setting the chart passes on, none of them its default.
VALUES = {
    "serviceAccounts": {"training": "team-trainer"},
    "sharedVolume": {"claimName": "team-shared", "mountPath": MOUNT},
    "training": {
        "image": {"repository": "registry.example.com/team/training", "tag": "7.7.7"},
        "imagePullSecrets": ["regcred-a", "regcred-b"],
        "clusterDomain": "corp.internal",
        "rdma": {"enabled": True, "resourceName": "rdma/ib", "hca": "mlx5", "gdrLevel": "PHB"},
    },
    # The training pods' keys are trainingName; name is the orchestrator's, which they never get.
    "secrets": {"s3": {"name": "orchestrator-s3", "trainingName": "team-s3"},
                "lakefs": {"name": "orchestrator-lakefs", "trainingName": "team-lakefs"}},
    "priorityClasses": {"training": {"name": "team-retrain"}, "adhoc": {"name": "team-experiment"}},
}
PIPES = {"DAGSTER_PIPES_CONTEXT": "e30=", "DAGSTER_PIPES_MESSAGES": "e30="}
SCHEDULED = {"dagster/schedule_name": "iris_retrain_schedule"}


@pytest.fixture(scope="module")
def chart():
    docs = render(VALUES, namespace=NAMESPACE)
    assert validate_all(docs) == len(docs)
    (cm,) = by_kind(docs, "ConfigMap")
    return {"docs": docs, "environ": cm["data"]}


@pytest.fixture
def definitions(chart, monkeypatch):
    """The definitions as the code location loads them in a pod whose env is the ConfigMap (plus the
    lakeFS Secret's variables, which helm/dagster-values.yaml adds from the Secret)."""
    from pipelines.definitions import build_definitions
    from pipelines.profiles import Profile

    for key, value in chart["environ"].items():
        monkeypatch.setenv(key, value)
    for key in ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "from-the-lakefs-secret")
    profile = Profile.from_environment()
    assert profile.name == "kubernetes" and profile.data_root == Path(MOUNT)
    spec = model_pipeline("iris", source="iris/*.csv", features=["a", "b"], label="y", classes=["p", "q"],
                          recipe={"gpus_per_node": 8, "nnodes": 2},
                          placement={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    return spec, profile, build_definitions(profile, [spec], with_yaml=False)


def training_manifests(spec, launcher, tags, locations, endpoint=None):
    root = Path(MOUNT) / "checkpoints" / spec.name / "run"
    config = runtime_config(spec, manifest={"splits": {"train": [], "validation": []}}, locations=locations,
                            commit_id="c0ffee", checkpoint_dir=root / "checkpoints", output_dir=root / "output",
                            s3_endpoint_url=endpoint)
    settings = launcher.pod_settings()
    job = with_run_priority(training_job(spec, "0123456789abcdef", config), settings, tags)
    check_paths_on_shared_volume(job.config, settings)
    manifests = build_manifests(job, settings, PIPES)
    assert validate_all(manifests) == 2  # the Indexed Job and its headless Service
    return job, manifests


def test_every_chart_setting_reaches_the_training_job(chart, definitions):
    spec, profile, defs = definitions
    resource = defs.resources["launcher"]
    # Step pods (Profile.executor) and training pods read the same keys through the same function.
    assert defs.resolve_job_def("iris_training").executor_def.name == "k8s"
    launcher = resource.get()
    assert launcher.pod_settings() == platform_settings(chart["environ"]) == platform_settings(os.environ)
    # Nothing the chart sets for the platform is dropped on the way.
    platform_keys = {k for k in chart["environ"] if k.startswith(("MODEL_FACTORY_", "TRAINING_"))}
    assert platform_keys <= set(resource.cluster_settings)

    job, (manifest, service) = training_manifests(spec, launcher, SCHEDULED,
                                                  {"train-00000.bin": f"file://{MOUNT}/shards/train-00000.bin"})
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert manifest["metadata"]["namespace"] == service["metadata"]["namespace"] == NAMESPACE
    assert container["image"] == "registry.example.com/team/training:7.7.7"
    assert pod["serviceAccountName"] == "team-trainer"
    assert pod["imagePullSecrets"] == [{"name": "regcred-a"}, {"name": "regcred-b"}]
    (shared,) = [v for v in pod["volumes"] if v["name"] == "shared"]
    assert shared["persistentVolumeClaim"]["claimName"] == "team-shared"
    assert {"name": "shared", "mountPath": MOUNT} in container["volumeMounts"]
    assert container["command"][-1] == config_path(job, launcher.pod_settings()) and \
        container["command"][-1].startswith(MOUNT + "/")
    assert any(a.startswith("--rdzv-endpoint=") and f".{NAMESPACE}.svc.corp.internal:" in a
               for a in container["command"])
    assert {env[k]["valueFrom"]["secretKeyRef"]["name"] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")} \
        == {"team-s3"}
    assert pod["priorityClassName"] == "team-retrain"
    assert container["resources"]["limits"]["rdma/ib"] == "1"
    assert env["NCCL_IB_HCA"]["value"] == "mlx5" and env["NCCL_NET_GDR_LEVEL"]["value"] == "PHB"
    assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]

    # The same pipeline run by hand, reading through lakeFS's gateway: the other class, the lakeFS keys.
    _, (adhoc, _) = training_manifests(spec, launcher, {"platform/trigger": "ad_hoc"},
                                       {"train-00000.bin": "s3://models/c0ffee/shards/train-00000.bin"},
                                       endpoint="http://lakefs:8000")
    assert adhoc["spec"]["template"]["spec"]["priorityClassName"] == "team-experiment"
    (container,) = adhoc["spec"]["template"]["spec"]["containers"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"team-lakefs"}


def test_the_resource_carries_only_the_charts_settings(chart):
    environ = {**chart["environ"], "MODEL_FACTORY_ALERT_WEBHOOK_URL": "https://hooks.example.com/T0/B0/secret",
               "LAKEFS_SECRET_ACCESS_KEY": "secret", "HOME": "/home/dagster"}
    kept = platform_environ(environ)
    assert "MODEL_FACTORY_ALERT_WEBHOOK_URL" not in kept and "LAKEFS_SECRET_ACCESS_KEY" not in kept
    assert "HOME" not in kept and kept["MODEL_FACTORY_TRAINING_LAKEFS_SECRET"] == "team-lakefs"
    assert platform_settings(kept) == platform_settings(environ)


def test_a_missing_chart_setting_fails_when_definitions_load(monkeypatch, tmp_path):
    from pipelines.profiles import kubernetes_resources

    with pytest.raises(ValueError, match="MODEL_FACTORY_SHARED_CLAIM not set.*model-factory-platform"):
        kubernetes_resources(tmp_path, environ={"TRAINING_NAMESPACE": "ml", "TRAINING_IMAGE": "img:1"})


def test_a_work_root_off_the_shared_mount_is_refused(chart):
    import dagster as dg

    from resources.platform import TrainingLauncherResource

    resource = TrainingLauncherResource(kind="kubernetes", work_root="/data", cluster_settings=chart["environ"])
    with pytest.raises(dg.DagsterInvariantViolationError, match=f"mount path '{MOUNT}'"):
        resource.get()
