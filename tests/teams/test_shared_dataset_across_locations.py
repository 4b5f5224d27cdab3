"""A pipeline in one code location trains on a dataset another location publishes: pinned to a
published version, lineage pointing at the owner, retrained when the owner publishes anew.
Real torchrun, one gloo rank, the 178-sample wine data."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest

from core.registry import read_lineage
from ops.published_dataset import DATASET_VERSION_TAG, dataset_to_train_on
from pipelines.api import (
    QualitySuite,
    model_pipeline,
    standard_raw_expectations,
    standard_shard_expectations,
    team_definitions,
)
from pipelines.models.wine import FEATURES, load_wine_frame
from tests.pipeline.conftest import failure_messages

pytestmark = pytest.mark.slow

RECIPE = {"epochs": 4, "batch_size": 16, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 100}
SOURCE = {"frame": load_wine_frame()}  # what the owner's loader returns; a test changes it to publish anew

grapes = model_pipeline(
    "grapes", source=lambda: SOURCE["frame"], features=FEATURES, label="cultivar", classes=range(3),
    id_column="sample_id",
    expectations=QualitySuite(raw=lambda spec: standard_raw_expectations(spec, min_rows=100),
                              shards=lambda spec: standard_shard_expectations(spec, max_fraction_error=0.1)),
    model="mlp", model_kwargs={"hidden_sizes": [16]}, recipe=RECIPE, gate={"min_test_accuracy": 0.5},
    split={"seed": 1, "samples_per_shard": 64}, team="cellar")

blend = model_pipeline(
    "blend", dataset="grapes", dataset_location="cellar", model="mlp", model_kwargs={"hidden_sizes": [8]},
    recipe=RECIPE, gate={"min_test_accuracy": 0.5}, triggers={"on_new_data": True}, team="tasting")


def run(platform, defs: dg.Definitions, pipeline: str, tags=None) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def(f"{pipeline}_training")
    return job.execute_in_process(instance=platform.instance, raise_on_error=False, tags=tags)


def tick(platform, defs: dg.Definitions, cursor: str | None):
    sensor = defs.resolve_sensor_def("blend_new_data_sensor")
    with dg.build_sensor_context(instance=platform.instance, cursor=cursor,
                                 resources={"store": platform.profile.resources()["store"]}) as context:
        return sensor.evaluate_tick(context)


def test_a_team_trains_on_another_locations_published_dataset(platform):
    cellar = team_definitions("cellar", [grapes], profile=platform.profile)
    tasting = team_definitions("tasting", [blend], profile=platform.profile)
    store = platform.store()

    # The consumer's location shows the owner's shards as an external asset it depends on.
    graph = tasting.resolve_asset_graph()
    shards_key = dg.AssetKey(["grapes", "shards"])
    assert shards_key in graph.get(dg.AssetKey(["blend", "checkpoint"])).parent_keys
    assert not graph.get(shards_key).is_materializable

    # Nothing published yet: the sensor waits, a launched run fails saying why.
    store.ensure_repository()
    assert "no published version" in tick(platform, tasting, None).skip_message
    early = run(platform, tasting, "blend")
    assert not early.success and "grapes" in failure_messages(early)

    owner_run = run(platform, cellar, "grapes")
    assert owner_run.success, failure_messages(owner_run)
    owner = read_lineage(store, "grapes")
    assert owner["data"]["dataset_version"] == "grapes-d1"

    first = tick(platform, tasting, None)
    (request,) = first.run_requests
    assert request.tags[DATASET_VERSION_TAG] == "grapes-d1" and first.cursor == "grapes-d1"

    consumer_run = run(platform, tasting, "blend", tags=request.tags)
    assert consumer_run.success, failure_messages(consumer_run)
    record = read_lineage(store, "blend")
    assert record["data"]["dataset"] == "grapes"
    assert record["data"]["shards_commit"] == owner["data"]["shards_commit"]
    assert record["data"]["raw_commit"] == owner["data"]["raw_commit"]
    assert record["data"]["location"] == "cellar"
    assert record["data"]["dataset_version"] == "grapes-d1"
    assert record["checks"]["shards"]["passed"] and record["checks"]["raw_dataset"]["passed"]

    assert tick(platform, tasting, "grapes-d1").run_requests == []

    # The owner publishes changed data: a new version, and the consumer's sensor asks for it.
    SOURCE["frame"] = pd.concat([load_wine_frame().iloc[:150]])
    try:
        again = run(platform, cellar, "grapes")
    finally:
        SOURCE["frame"] = load_wine_frame()
    assert again.success, failure_messages(again)
    assert read_lineage(store, "grapes")["data"]["dataset_version"] == "grapes-d2"
    (newer,) = tick(platform, tasting, "grapes-d1").run_requests
    assert newer.tags[DATASET_VERSION_TAG] == "grapes-d2"

    # A pinned pipeline keeps reading the version it names.
    pinned = model_pipeline("blend_pinned", dataset="grapes", dataset_location="cellar", dataset_version="grapes-d1")
    shards = dataset_to_train_on(store, pinned, {})
    assert shards["commit_id"] == owner["data"]["shards_commit"] and shards["dataset_version"] == "grapes-d1"
    assert dataset_to_train_on(store, blend, {})["dataset_version"] == "grapes-d2"  # unpinned: the newest
    # A run the sensor started trains on the version it was started for, even after a newer one.
    assert dataset_to_train_on(store, blend, newer.tags | {DATASET_VERSION_TAG: "grapes-d1"})["commit_id"] == \
        owner["data"]["shards_commit"]


def test_a_dataset_name_published_by_another_location_is_not_overwritten(platform):
    cellar = team_definitions("cellar", [grapes], profile=platform.profile)
    assert run(platform, cellar, "grapes").success
    impostor = team_definitions("vineyard", [grapes], profile=platform.profile)

    result = run(platform, impostor, "grapes")

    assert not result.success
    assert "published by code location 'cellar'" in failure_messages(result)
    assert "would overwrite it" in failure_messages(result)


def test_a_dataset_pipeline_publishes_its_shards_when_they_pass_their_checks(platform):
    from core.datasets import list_dataset_versions
    from pipelines.api import dataset_pipeline

    cellar_data = dataset_pipeline(
        "cellar_data", source=lambda: SOURCE["frame"], features=FEATURES, label="cultivar", classes=range(3),
        id_column="sample_id", expectations=grapes.expectations, split={"seed": 1, "samples_per_shard": 64})
    defs = team_definitions("cellar", [cellar_data], profile=platform.profile)
    assert {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()} == {
        "cellar_data/raw_dataset", "cellar_data/shards"}
    store = platform.store()

    first, again = run(platform, defs, "cellar_data"), run(platform, defs, "cellar_data")

    assert first.success and again.success, failure_messages(first) + failure_messages(again)
    (version,) = list_dataset_versions(store, "cellar_data")  # the same data again is the same version
    assert version.tag == "cellar_data-d1" and sum(version.num_samples.values()) == len(SOURCE["frame"])
    assert version.checks["shards"].passed and version.models == ()
    assert store.exists("main", "datasets/cellar_data/shards/manifest.json")
    shards = [e for e in again.get_asset_materialization_events() if e.asset_key.path[-1] == "shards"]
    assert shards[0].materialization.metadata["dataset_version"].value == "cellar_data-d1"
