"""Pods that read shards through lakeFS's S3 gateway authenticate with the lakeFS keys (the chart's
secrets.lakefs.trainingName), never the S3 secret's; pods reading file:// shards keep the S3 secret."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.spec import model_pipeline
from ops.training_config import runtime_config, training_job
from resources.k8s.manifests import build_training_job, reads_through_lakefs
from resources.k8s.step_config import lakefs_secret_env, platform_settings
from resources.store.base import MAIN
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.store_backends import make_lakefs_store
from tests.k8s.helpers import validate_all
from tests.k8s.test_helm import by_kind, render

SPEC = model_pipeline("iris", source="iris/*.csv", features=["a", "b"], label="y", classes=["p", "q"],
                      recipe={"gpus_per_node": 1})
MANIFEST = {"splits": {"train": [{"path": "train-00000.bin"}], "validation": [{"path": "validation-00000.bin"}]}}


def job_reading(locations: dict[str, str], endpoint: str | None):
    config = runtime_config(SPEC, manifest=MANIFEST, locations=locations, commit_id="c0ffee", s3_endpoint_url=endpoint,
                            checkpoint_dir=Path("/mnt/training/iris/ckpt"), output_dir=Path("/mnt/training/iris/out"))
    return training_job(SPEC, "0123456789abcdef", config)


def secret_refs(manifest) -> dict[str, tuple[str, str]]:
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}


@pytest.fixture(scope="module")
def chart_settings():
    # The training pods' keys (trainingName); the orchestrator's (name) never reach them.
    (cm,) = by_kind(render({"secrets": {"s3": {"name": "orchestrator-s3", "trainingName": "team-s3"},
                                        "lakefs": {"name": "orchestrator-lakefs", "trainingName": "team-lakefs"}}}),
                    "ConfigMap")
    return platform_settings(cm["data"])


@pytest.fixture(scope="module")
def lakefs_locations(tmp_path_factory):
    """Where a lakeFS store (the real SDK against the lakeFS-API test server) says a committed shard
    is: an s3:// URL served at the store's endpoint, its S3 gateway."""
    with LakeFSTestServer(tmp_path_factory.mktemp("lakefs"), stall_s=10) as server:
        store = make_lakefs_store(server)
        store.ensure_repository()
        store.put_object(MAIN, "shards/iris/train-00000.bin", b"shard")
        commit = store.commit(MAIN, "shards").id
        location = store.pinned_location(commit, "shards/iris/train-00000.bin")
    return {"train-00000.bin": location.uri}, location.s3_endpoint_url


def test_lakefs_gateway_reads_take_the_lakefs_keys(chart_settings, lakefs_locations):
    locations, endpoint = lakefs_locations
    assert locations["train-00000.bin"].startswith("s3://") and endpoint
    job = job_reading(locations, endpoint)
    assert reads_through_lakefs(job.config)
    manifest = build_training_job(job, chart_settings)
    assert validate_all([manifest]) == 1
    assert secret_refs(manifest) == {"AWS_ACCESS_KEY_ID": ("team-lakefs", "LAKEFS_ACCESS_KEY_ID"),
                                     "AWS_SECRET_ACCESS_KEY": ("team-lakefs", "LAKEFS_SECRET_ACCESS_KEY")}


def test_local_shards_keep_the_s3_secret(chart_settings):
    manifest = build_training_job(job_reading({"train-00000.bin": "file:///mnt/training/shards/a.bin"}, None),
                                  chart_settings)
    refs = secret_refs(manifest)
    assert {name for name, _ in refs.values()} == {"team-s3"}
    assert refs["AWS_ACCESS_KEY_ID"] == ("team-s3", "AWS_ACCESS_KEY_ID")


def test_s3_urls_without_a_gateway_endpoint_are_plain_s3(chart_settings):
    job = job_reading({"train-00000.bin": "s3://bucket/shards/a.bin"}, None)
    assert not reads_through_lakefs(job.config)
    assert {name for name, _ in secret_refs(build_training_job(job, chart_settings)).values()} == {"team-s3"}


def test_reading_through_lakefs_without_its_secret_names_the_chart_value(chart_settings, lakefs_locations):
    locations, endpoint = lakefs_locations
    settings = dataclasses.replace(chart_settings, lakefs_secret_env=())
    with pytest.raises(ValueError, match=r"secrets\.lakefs\.trainingName \(MODEL_FACTORY_TRAINING_LAKEFS_SECRET"):
        build_training_job(job_reading(locations, endpoint), settings)


def test_the_launcher_carries_the_lakefs_secret(chart_settings):
    from resources.k8s.launcher import KubernetesTrainingLauncher, launcher_kwargs

    launcher = KubernetesTrainingLauncher(**launcher_kwargs(chart_settings))
    assert launcher.lakefs_secret == "team-lakefs"
    assert launcher.pod_settings().lakefs_secret_env == lakefs_secret_env("team-lakefs")
