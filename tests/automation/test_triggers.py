"""Retraining triggers with Dagster's test contexts on a real temporary instance and store."""

from __future__ import annotations

import dataclasses
import io

import dagster as dg
import pandas as pd
import pytest
from dagster._core.test_utils import create_run_for_test

from assets.pipeline import SOURCE_COMMIT_TAG
from core.spec import Source, Triggers
from pipelines.automation import MODEL_TAG, PRIORITY_TAG, TRIGGER_TAG
from pipelines.definitions import build_definitions, training_job_name
from pipelines.models.digits import digits_frame, digits_pipeline
from pipelines.models.wine import wine_pipeline
from tests.pipeline.conftest import failure_messages

SPEC = dataclasses.replace(digits_pipeline, source=Source(paths=("digits/*.csv",)),
                           triggers=Triggers(cron="0 3 * * 1"))


@pytest.fixture
def defs(platform):
    return build_definitions(platform.profile, [SPEC, wine_pipeline], with_yaml=False)


def _tick(defs, platform, cursor):
    sensor = defs.resolve_sensor_def("digits_new_data_sensor")
    with dg.build_sensor_context(instance=platform.instance, cursor=cursor,
                                 resources={"store": platform.profile.resources()["store"]}) as context:
        return sensor.evaluate_tick(context)


def _upload(store, path: str, frame: pd.DataFrame, message: str = "Upload") -> str:
    """What a user does: commit source files to main under sources/<pipeline>/."""
    store.ensure_repository()
    branch = "upload"
    store.create_branch(branch, "main", exist_ok=True)
    buf = io.BytesIO()
    frame.to_csv(buf, index=False)
    store.put_object(branch, path, buf.getvalue())
    store.commit(branch, message, {"uploaded_by": "test"})
    return store.merge(branch, "main", message)


def _running_run(instance, model: str) -> dg.DagsterRun:
    return create_run_for_test(instance, job_name=f"{model}_training", status=dg.DagsterRunStatus.STARTED,
                                        tags={MODEL_TAG: model})


def test_sensor_launches_once_per_new_source_commit_and_ignores_other_commits(defs, platform):
    store = platform.store()
    store.ensure_repository()
    first = _tick(defs, platform, None)
    assert not first.run_requests and "without changes" in first.skip_message
    head = store.resolve_ref("main")
    assert first.cursor == head

    new_head = _upload(store, "sources/digits/part-1.csv", digits_frame().head(1200))
    tick = _tick(defs, platform, first.cursor)
    (request,) = tick.run_requests
    assert tick.cursor == new_head
    assert request.tags[SOURCE_COMMIT_TAG] == new_head
    assert request.tags[MODEL_TAG] == "digits" and request.tags[TRIGGER_TAG] == "new_data"
    assert request.tags[PRIORITY_TAG] == "10"
    assert request.run_key == f"digits:{new_head}"

    again = _tick(defs, platform, tick.cursor)
    assert not again.run_requests and "still at" in again.skip_message

    # A commit outside sources/digits/ (e.g. a published model, or another pipeline's upload).
    other = _upload(store, "sources/other/file.csv", digits_frame().head(3))
    unrelated = _tick(defs, platform, tick.cursor)
    assert not unrelated.run_requests and unrelated.cursor == other


def test_sensor_waits_for_a_running_retrain_and_then_takes_the_newest_commit(defs, platform):
    store = platform.store()
    c1 = _upload(store, "sources/digits/part-1.csv", digits_frame().head(1200))
    cursor = _tick(defs, platform, None).cursor
    assert cursor == c1
    running = _running_run(platform.instance, "digits")

    c2 = _upload(store, "sources/digits/part-2.csv", digits_frame().tail(400), "Second upload")
    waiting = _tick(defs, platform, cursor)
    assert not waiting.run_requests and running.run_id in waiting.skip_message
    assert waiting.cursor in (None, cursor)  # not advanced: c2 is still to be trained on
    c3 = _upload(store, "sources/digits/part-3.csv", digits_frame().tail(50), "Third upload")
    assert c3 != c2

    platform.instance.report_run_canceled(running)
    (request,) = _tick(defs, platform, cursor).run_requests
    assert request.tags[SOURCE_COMMIT_TAG] == c3  # the newest, never skipped


def test_new_data_run_ingests_the_sources_at_the_sensor_commit(defs, platform):
    store = platform.store()
    frame = digits_frame()
    _upload(store, "sources/digits/part-1.csv", frame.head(1100))
    c2 = _upload(store, "sources/digits/part-2.csv", frame.iloc[1100:1500], "Second upload")
    (request,) = _tick(defs, platform, None).run_requests
    _upload(store, "sources/digits/part-3.csv", frame.iloc[1500:], "Later upload, not in this run")

    result = platform.run_assets(SPEC, ["raw_dataset"], tags=request.tags)

    assert result.success, failure_messages(result)
    value = result.output_for_node("digits__raw_dataset")
    assert value["source_commit"] == c2 and value["rows"] == 1500
    (mat,) = result.get_asset_materialization_events()
    assert mat.materialization.metadata["source_commit"].value == c2


def test_schedule_requests_a_prioritised_run_unless_the_model_is_already_retraining(defs, platform):
    store = platform.store()
    head = _upload(store, "sources/digits/part-1.csv", digits_frame().head(1200))
    schedule = defs.resolve_schedule_def("digits_retrain_schedule")
    assert schedule.cron_schedule == "0 3 * * 1"
    resources = {"store": platform.profile.resources()["store"]}

    with dg.build_schedule_context(instance=platform.instance, resources=resources) as context:
        (request,) = schedule.evaluate_tick(context).run_requests
    assert request.tags[TRIGGER_TAG] == "schedule" and request.tags[PRIORITY_TAG] == "10"
    assert request.tags[SOURCE_COMMIT_TAG] == head

    _running_run(platform.instance, "digits")
    with dg.build_schedule_context(instance=platform.instance, resources=resources) as context:
        busy = schedule.evaluate_tick(context)
    assert not busy.run_requests and "already retraining" in busy.skip_message

    wine = defs.resolve_schedule_def("wine_retrain_schedule")  # a loader source: no store commit to pin
    with dg.build_schedule_context(instance=platform.instance, resources=resources) as context:
        (wine_request,) = wine.evaluate_tick(context).run_requests
    assert SOURCE_COMMIT_TAG not in wine_request.tags and wine_request.tags["platform/team"] == "oenology"


def test_ad_hoc_runs_get_low_priority_and_loader_pipelines_have_no_sensor(defs):
    assert defs.resolve_job_def(training_job_name(SPEC)).tags[PRIORITY_TAG] == "0"
    # besides the location's run-failure alert (pipelines/alerts.py), only digits has a sensor
    assert {s.name for s in defs.sensors} == {"digits_new_data_sensor", "run_failure_alert"}


def test_evaluation_follows_a_new_checkpoint(defs, platform):
    """model_version is eager: a checkpoint materialized on its own is evaluated automatically."""
    keys = {s: dg.AssetKey(["digits", s]) for s in ("raw_dataset", "shards", "checkpoint", "model_version")}
    instance = platform.instance
    for stage in ("raw_dataset", "shards", "checkpoint", "model_version"):
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=keys[stage]))
    quiet = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert quiet.get_num_requested(keys["model_version"]) == 0

    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=keys["checkpoint"]))
    follow = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=quiet.cursor)
    assert follow.get_num_requested(keys["model_version"]) == 1
    assert follow.get_num_requested(keys["checkpoint"]) == 0
