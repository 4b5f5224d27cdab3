"""The whole pipeline with real torchrun (2 gloo ranks) on a temporary instance and store."""

from __future__ import annotations

import dataclasses
import json

import pytest

from core.lineage import commit_ids
from core.registry import list_versions, read_lineage
from core.spec import QualityGate
from pipelines.models.digits import digits_pipeline, write_digits_source
from tests.pipeline.conftest import failure_messages

pytestmark = pytest.mark.slow


def test_demo_job_registers_versions_with_resolvable_lineage(platform):
    """The job `make demo` runs; a second run registers version 2."""
    write_digits_source(platform.sources)
    first = platform.run(digits_pipeline)
    assert first.success, failure_messages(first)
    store = platform.store()
    record = read_lineage(store, "digits")
    assert record["version"] == 1
    for name, cid in commit_ids(record).items():
        assert store.resolve_ref(cid) == cid, name
    assert record["evaluation"]["test"]["accuracy"] >= digits_pipeline.gate.min_test_accuracy
    assert record["training"]["world_size"] == 2
    assert record["training"]["backend"] == "gloo"
    assert record["training"]["seed"] == 0
    assert record["dagster"]["run_id"] == first.run_id
    assert len(record["checkpoint"]["sha256"]) == 64
    # The published version is on main, and its weights match the record's checksum.
    import hashlib
    weights = store.get_object("main", "models/digits/versions/v1/model.safetensors")
    assert hashlib.sha256(weights).hexdigest() == record["checkpoint"]["sha256"]
    # Data versions are store commit ids.
    mats = {e.asset_key.path[-1]: e for e in first.get_asset_materialization_events()}
    assert mats["shards"].materialization.tags["dagster/data_version"] == record["data"]["shards_commit"]

    second = platform.run(digits_pipeline)
    assert second.success, failure_messages(second)
    assert list_versions(store, "digits") == [1, 2]
    assert read_lineage(store, "digits")["dagster"]["run_id"] == second.run_id


def test_failed_quality_gate_leaves_main_untouched(platform):
    write_digits_source(platform.sources)
    spec = dataclasses.replace(digits_pipeline, gate=QualityGate(min_test_accuracy=1.0),
                               recipe=dataclasses.replace(digits_pipeline.recipe, epochs=1))
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")
    result = platform.run(spec)
    assert not result.success
    assert "failed its quality gate" in failure_messages(result)
    assert store.resolve_ref("main") == main_before
    assert list_versions(store, "digits") == []
    branch = f"run-{result.run_id}"
    evaluation = json.loads(store.get_object(branch, f"models/digits/candidates/{result.run_id}/evaluation.json"))
    assert evaluation["gate"]["passed"] is False
