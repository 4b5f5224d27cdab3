"""Several pipelines in one store: a CNN sharing the digits shards (declared in YAML), and the wine
pipeline beside them. Real torchrun, 2 gloo ranks, few epochs."""

from __future__ import annotations

import dataclasses
import json

import dagster as dg
import pytest

from core.registry import list_versions, read_lineage
from pipelines.components import ModelPipelineComponent, load_component_tree, yaml_pipelines
from pipelines.definitions import build_definitions
from pipelines.models.digits import digits_pipeline, write_digits_source
from pipelines.models.wine import wine_pipeline
from tests.pipeline.conftest import failure_messages

pytestmark = pytest.mark.slow


def test_yaml_component_declares_a_cnn_on_the_digits_shards(tmp_path):
    tree = load_component_tree()
    (component,) = tree.get_all_components(of_type=ModelPipelineComponent)
    spec = component.to_spec()
    assert (spec.name, spec.dataset, spec.model, spec.recipe.epochs) == ("digits_cnn", "digits", "cnn", 3)
    assert [s.name for s in yaml_pipelines()] == ["digits_cnn"]

    # Loaded the way Dagster loads a defs folder: its own assets, reading digits' shards.
    defs = tree.build_defs()
    graph = defs.resolve_asset_graph()
    checkpoint = dg.AssetKey(["digits_cnn", "checkpoint"])
    assert dg.AssetKey(["digits", "shards"]) in graph.get(checkpoint).parent_keys
    assert defs.resolve_job_def("digits_cnn_training") is not None


def test_shared_shards_two_models_one_commit_and_a_second_dataset_beside(platform):
    write_digits_source(platform.sources)
    digits = dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, epochs=3),
                                 gate=dataclasses.replace(digits_pipeline.gate, min_test_accuracy=0.8))
    store = platform.store()

    both = platform.run(digits, with_yaml=True)  # digits_training trains the MLP and the YAML CNN

    assert both.success, failure_messages(both)
    mlp, cnn = read_lineage(store, "digits"), read_lineage(store, "digits_cnn")
    assert mlp["data"]["shards_commit"] == cnn["data"]["shards_commit"]
    assert mlp["data"]["raw_commit"] == cnn["data"]["raw_commit"]
    assert cnn["data"]["dataset"] == "digits"
    assert cnn["training"]["config"]["model"]["name"] == "cnn"
    assert mlp["training"]["config"]["model"]["name"] == "mlp"
    for record in (mlp, cnn):
        assert record["checks"]["raw_dataset"]["passed"] and record["checks"]["shards"]["passed"]
        assert record["checks"]["dataset"] == "digits"
    shard_mats = [e for e in both.get_asset_materialization_events() if e.asset_key.path[-1] == "shards"]
    assert len(shard_mats) == 1  # one shards materialization feeds both models
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in both.get_asset_check_evaluations()}
    # training_health warns with what the guards saw on this busy machine; only that it ran is asserted.
    assert {k for k in checks if k[1] == "training_health"} == {("digits/checkpoint", "training_health"),
                                                                 ("digits_cnn/checkpoint", "training_health")}
    assert {k: v for k, v in checks.items() if k[1] != "training_health"} == {
        ("digits/raw_dataset", "raw_expectations"): True, ("digits/shards", "shard_expectations"): True}
    shards_commit = store.get_commit(mlp["data"]["shards_commit"])
    assert json.loads(shards_commit.metadata["check_results"])["passed"] is True

    # Wine's trainings are sweeps (tests/experiments runs one); here it trains its recipe once.
    wine = platform.run(dataclasses.replace(wine_pipeline, sweep=None))

    assert wine.success, failure_messages(wine)
    record = read_lineage(store, "wine")
    assert record["version"] == 1 and record["data"]["dataset"] == "wine"
    assert record["evaluation"]["test"]["accuracy"] >= wine_pipeline.gate.min_test_accuracy
    assert record["checks"]["raw_dataset"]["passed"]
    assert {m: list_versions(store, m) for m in ("digits", "digits_cnn", "wine")} == {
        "digits": [1], "digits_cnn": [1], "wine": [1]}
    assert store.exists("main", "datasets/wine/validation/raw_dataset.json")


def test_all_pipelines_load_together(platform):
    defs = build_definitions(platform.profile, [digits_pipeline, wine_pipeline])
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"digits/shards", "digits_cnn/checkpoint", "digits_cnn/model_version", "wine/model_version"} <= keys
    assert "digits_cnn/shards" not in keys
    assert {s.name for s in defs.schedules} == {
        "digits_retrain_schedule", "wine_retrain_schedule", "digits_cnn_retrain_schedule", "store_housekeeping_daily"}
