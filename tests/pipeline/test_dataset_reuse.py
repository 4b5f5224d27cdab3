"""One dataset version is one commit: a run on unchanged data reuses the newest version's commit
without ingesting or sharding, its lineage names that version beside that very commit, and
``datasets`` (core.datasets.list_dataset_versions) agrees with every lineage record, a failed
model gate in between included. Real Dagster runs, real torchrun (one gloo rank), the wine data.
New data as a new version with its own commit: tests/core/test_datasets.py numbers them, and
tests/cli's demo platform registers digits-d1 and digits-d2 and lists them beside the records."""

from __future__ import annotations

import dataclasses

import pytest

from core.datasets import dataset_tags, list_dataset_versions, version_disagreements
from core.registry import read_lineage
from pipelines.api import dataset_pipeline, model_pipeline
from pipelines.models.wine import FEATURES, load_wine_frame, wine_pipeline
from tests.pipeline.conftest import failure_messages

pytestmark = pytest.mark.slow

SOURCE = {"frame": load_wine_frame()}
RECIPE = {"epochs": 3, "batch_size": 16, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 100}

vintage = dataset_pipeline("vintage", source=lambda: SOURCE["frame"], features=FEATURES, label="cultivar",
                           classes=range(3), id_column="sample_id", expectations=wine_pipeline.expectations,
                           split={"seed": 1, "samples_per_shard": 64})
taster = model_pipeline("taster", dataset="vintage", model="mlp", model_kwargs={"hidden_sizes": [16]},
                        recipe=RECIPE, gate={"test_loss": {"max": 0.0}})  # no model passes: a failed gate


def _metadata(result, stage: str) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path == ["vintage", stage]]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def _ingests(store) -> int:
    return sum(c.message.startswith("Ingest raw data of vintage") for c in store.log("main", limit=1000))


def _agree(store) -> None:
    """What `datasets vintage` lists and what the lineage records say name the same commits."""
    tags = dataset_tags(store, "vintage")
    for version in list_dataset_versions(store, "vintage"):
        assert version.commit_id == tags[version.number]
        for named in version.models:
            record = read_lineage(store, "taster", int(named.split(" v")[1]))
            assert record["data"]["dataset_version"] == version.tag and record["data"]["shards_commit"] == version.commit_id
    assert version_disagreements(store, "vintage") == []


def test_unchanged_data_reuses_its_version_and_commit_after_a_failed_gate(platform):
    store = platform.store()
    failed = platform.run(vintage, specs=[vintage, taster])
    assert not failed.success and "failed its quality gate" in failure_messages(failed)
    (first,) = list_dataset_versions(store, "vintage")  # the dataset published before the model's gate
    assert first.tag == "vintage-d1" and first.models == () and _ingests(store) == 1

    passing = dataclasses.replace(taster, gate=dataclasses.replace(taster.gate, bounds={}, min_test_accuracy=0.5))
    again = platform.run(vintage, specs=[vintage, passing])

    assert again.success, failure_messages(again)
    # Nothing was ingested or sharded: both assets name d1's commits and say so.
    raw, shards = _metadata(again, "raw_dataset"), _metadata(again, "shards")
    assert raw["reused_dataset_version"] == shards["reused_dataset_version"] == "vintage-d1"
    assert shards["commit_id"] == first.commit_id and _ingests(store) == 1
    logs = [e.message for e in platform.instance.all_logs(again.run_id) if "reusing vintage-d1" in (e.message or "")]
    assert logs and "nothing is ingested or sharded" in logs[0]
    record = read_lineage(store, "taster")
    assert record["data"]["dataset_version"] == "vintage-d1" and record["data"]["shards_commit"] == first.commit_id
    assert record["data"]["raw_commit"] == first_raw_commit(store, first.commit_id)
    assert list_dataset_versions(store, "vintage")[0].models == ("taster v1",)
    _agree(store)


def first_raw_commit(store, shards_commit: str) -> str:
    import json

    return json.loads(store.get_object(shards_commit, "datasets/vintage/shards/manifest.json"))["source_commit"]
