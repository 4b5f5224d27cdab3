"""A real local training (torchrun, 2 gloo ranks) shows its telemetry while it runs: observations of
the checkpoint asset, written to the event log as rank 0 reports, before the training ends; and the
checkpoint's training-health check runs without holding back the evaluation."""

from __future__ import annotations

import dataclasses
import json
import math

import dagster as dg
import pytest

from core.spec import QualityGate
from ops.training_health import CHECK_NAME
from pipelines.models.digits import digits_pipeline, write_digits_source
from tests.pipeline.conftest import failure_messages

pytestmark = pytest.mark.slow

CHECKPOINT = dg.AssetKey(["digits", "checkpoint"])
TELEMETRY_EVERY = 10  # the runtime's default telemetry.every_steps; recipes do not set it


def test_telemetry_reaches_the_checkpoint_asset_during_the_run(platform):
    write_digits_source(platform.sources)
    spec = dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, epochs=2),
                               gate=QualityGate(min_test_accuracy=0.5))

    result = platform.run(spec)

    assert result.success, failure_messages(result)
    records = platform.instance.get_records_for_run(result.run_id).records
    observations = [r for r in records if r.event_log_entry.dagster_event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    assert observations and {r.event_log_entry.dagster_event.asset_key for r in observations} == {CHECKPOINT}
    metas = [r.event_log_entry.dagster_event.asset_observation_data.asset_observation.metadata for r in observations]

    # One observation per telemetry message: every TELEMETRY_EVERY steps and at the last step.
    (checkpoint,) = [m for m in result.get_asset_materialization_events() if m.asset_key == CHECKPOINT]
    steps = checkpoint.materialization.metadata["steps"].value
    assert [m["step"].value for m in metas] == sorted({*range(TELEMETRY_EVERY, steps + 1, TELEMETRY_EVERY), steps})
    for meta in metas:
        assert math.isfinite(meta["loss"].value) and meta["samples_per_second"].value > 0
        assert meta["per_rank_step_time_s_max_over_median"].value >= 1.0
    assert metas[-1]["loss"].value < metas[0]["loss"].value  # the curve a run of digits draws goes down

    # Live, not replayed at the end: the first observation is in the event log before rank 0's last
    # progress line, which it sends just before it finishes.
    progress = [r.storage_id for r in records if f"step {steps}/{steps} (100%)" in r.event_log_entry.user_message]
    assert progress and observations[0].storage_id < progress[0]

    # The health check ran on the checkpoint as a non-blocking warning, and the evaluation did not wait on it.
    (health,) = [e for e in result.get_asset_check_evaluations() if e.check_name == CHECK_NAME]
    assert health.asset_key == CHECKPOINT and health.severity == dg.AssetCheckSeverity.WARN
    detections = json.loads(platform.store().get_object(
        checkpoint.materialization.metadata["commit_id"].value,
        f"models/digits/checkpoints/{result.run_id}/metrics.json")).get("detections", [])
    assert health.passed is (not detections)
    assert health.metadata["detections"].value == len(detections)
    assert dg.AssetKey(["digits", "model_version"]) in {m.asset_key for m in result.get_asset_materialization_events()}
