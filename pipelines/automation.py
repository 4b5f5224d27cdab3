"""When pipelines retrain, in what order queued runs start, and how GPU capacity is shared.

Run tags (set on every run a schedule, sensor or the UI starts):
- ``platform/model``: the pipeline; ``dagster.yaml`` limits it to one run at a time per value, and
  schedules and sensors skip while one is queued or running, so retrains never overlap.
- ``platform/team``: limited per team in ``dagster.yaml``.
- ``dagster/priority``: scheduled and new-data retraining (10) start before ad-hoc runs (0).
- ``platform/gpus``: GPU units the run's training step takes (see ``resources.gpu_pool.gpu_units``).

"New data" means: a commit on the store's ``main`` that changed the pipeline's source area
(``sources/<fixed part of each source path>``, e.g. ``sources/digits/``). Users upload source
files by committing them there (any backend: local store or lakeFS). The sensor's cursor is the
last ``main`` commit it has seen; a run it starts ingests the sources at that commit (tag
``platform/source_commit``). While a retrain of the model is queued or running the sensor waits
without moving its cursor, so the newest commit is never skipped.
"""

from __future__ import annotations

from typing import Sequence

import dagster as dg

from assets.pipeline import SOURCE_COMMIT_TAG, source_area
from core.datasets import resolve_dataset_version
from core.spec import PipelineSpec
from ops.published_dataset import DATASET_VERSION_TAG
from resources.platform import VersionedStoreResource
from resources.store.base import MAIN, RefNotFoundError

MODEL_TAG, TEAM_TAG, TRIGGER_TAG, GPUS_TAG = "platform/model", "platform/team", "platform/trigger", "platform/gpus"
PRIORITY_TAG = "dagster/priority"
PRIORITY = {"schedule": 10, "new_data": 10, "ad_hoc": 0}
IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def run_tags(spec: PipelineSpec, trigger: str) -> dict[str, str]:
    return {MODEL_TAG: spec.name, TEAM_TAG: spec.team, TRIGGER_TAG: trigger, GPUS_TAG: str(spec.gpus),
            PRIORITY_TAG: str(PRIORITY[trigger])}


def in_flight_runs(instance: dg.DagsterInstance, models: Sequence[str]) -> list[str]:
    """Ids of queued or running runs that train any of ``models``."""
    ids: list[str] = []
    for model in models:
        ids += [r.run_id for r in instance.get_runs(
            dg.RunsFilter(tags={MODEL_TAG: model}, statuses=IN_FLIGHT), limit=10)]
    return ids


def overlapping_models(spec: PipelineSpec, specs: Sequence[PipelineSpec]) -> list[str]:
    """A run of ``spec`` trains these models too (an owner's job trains its sharers)."""
    sharers = [s.name for s in specs if s.dataset == spec.name]
    return [spec.name, *sharers, *([spec.dataset] if spec.dataset else [])]


def new_source_paths(store, cursor: str | None, head: str, areas: Sequence[str]) -> list[str]:
    """Source files added, changed or removed on ``main`` since ``cursor`` (all of them at first)."""
    if cursor is not None:
        try:
            store.resolve_ref(cursor)
        except RefNotFoundError:
            cursor = None  # the store was recreated; treat as a first look
    if cursor is None:
        return [o.path for a in areas for o in store.list_objects(head, prefix=a)]
    return [d.path for a in areas for d in store.diff(cursor, head, prefix=a)]


def build_schedule(spec: PipelineSpec, job, specs: Sequence[PipelineSpec]) -> dg.ScheduleDefinition | None:
    t = spec.triggers
    if not t.cron:
        return None
    busy_models = overlapping_models(spec, specs)

    @dg.schedule(name=f"{spec.name}_retrain_schedule", cron_schedule=t.cron, execution_timezone=t.timezone,
                 job=job,
                 default_status=dg.DefaultScheduleStatus.RUNNING if t.active else dg.DefaultScheduleStatus.STOPPED,
                 description=f"Retrain {spec.name} on its newest data ({t.cron}, {t.timezone}).")
    def retrain_schedule(context: dg.ScheduleEvaluationContext, store: VersionedStoreResource):
        busy = in_flight_runs(context.instance, busy_models)
        if busy:
            return dg.SkipReason(f"{spec.name} is already retraining (run {busy[0]}); not starting another")
        tags = run_tags(spec, "schedule")
        if source_area(spec):
            s = store.get()
            s.ensure_repository()
            tags[SOURCE_COMMIT_TAG] = s.resolve_ref(MAIN)
        return dg.RunRequest(tags=tags)

    return retrain_schedule


def build_new_data_sensor(spec: PipelineSpec, job, specs: Sequence[PipelineSpec]) -> dg.SensorDefinition | None:
    if spec.published_elsewhere:
        return build_published_dataset_sensor(spec, job, specs)
    areas = source_area(spec)
    if not spec.triggers.on_new_data or not areas:
        return None  # loader sources and shared datasets: the owner's job retrains them
    busy_models = overlapping_models(spec, specs)

    @dg.sensor(name=f"{spec.name}_new_data_sensor", job=job, default_status=dg.DefaultSensorStatus.RUNNING if spec.triggers.active else dg.DefaultSensorStatus.STOPPED,
               minimum_interval_seconds=spec.triggers.sensor_interval_s,
               description=f"Retrain {spec.name} when source files under {', '.join(areas)} change on main.")
    def new_data_sensor(context: dg.SensorEvaluationContext, store: VersionedStoreResource):
        s = store.get()
        s.ensure_repository()
        head = s.resolve_ref(MAIN)
        if context.cursor == head:
            return dg.SkipReason(f"main is still at {head[:12]}")
        changed = new_source_paths(s, context.cursor, head, areas)
        if not changed:
            context.update_cursor(head)
            return dg.SkipReason(f"main moved to {head[:12]} without changes under {', '.join(areas)}")
        busy = in_flight_runs(context.instance, busy_models)
        if busy:  # the cursor stays: the next tick after that run starts one on the newest commit
            return dg.SkipReason(f"new data at {head[:12]}, waiting for run {busy[0]} of {spec.name} to finish")
        context.update_cursor(head)
        return dg.RunRequest(run_key=f"{spec.name}:{head}", tags={
            **run_tags(spec, "new_data"), SOURCE_COMMIT_TAG: head})

    return new_data_sensor


def build_published_dataset_sensor(spec: PipelineSpec, job, specs: Sequence[PipelineSpec]) -> dg.SensorDefinition | None:
    """Retrain when the owning location publishes a new version of the dataset (a new ``-d<N>`` tag).

    Only when the pipeline asks for it (``triggers.on_new_data``) and does not pin a version. The
    cursor is the newest version seen; each run is tagged with the version it must train on.
    """
    if not spec.triggers.on_new_data or spec.dataset_version is not None:
        return None
    busy_models = overlapping_models(spec, specs)

    @dg.sensor(name=f"{spec.name}_new_data_sensor", job=job, minimum_interval_seconds=spec.triggers.sensor_interval_s,
               default_status=dg.DefaultSensorStatus.RUNNING if spec.triggers.active else dg.DefaultSensorStatus.STOPPED,
               description=f"Retrain {spec.name} when code location {spec.dataset_location!r} publishes a new "
                           f"version of {spec.dataset!r}.")
    def published_data_sensor(context: dg.SensorEvaluationContext, store: VersionedStoreResource):
        s = store.get()
        s.ensure_repository()
        try:
            newest, _ = resolve_dataset_version(s, spec.dataset, None)
        except LookupError:
            return dg.SkipReason(f"{spec.dataset!r} has no published version yet")
        if context.cursor == newest:
            return dg.SkipReason(f"{newest} is still the newest version of {spec.dataset!r}")
        busy = in_flight_runs(context.instance, busy_models)
        if busy:  # the cursor stays, so the next tick after that run trains on the newest version
            return dg.SkipReason(f"{newest} is published; waiting for run {busy[0]} of {spec.name} to finish")
        context.update_cursor(newest)
        return dg.RunRequest(run_key=f"{spec.name}:{newest}", tags={**run_tags(spec, "new_data"),
                                                                    DATASET_VERSION_TAG: newest})

    return published_data_sensor
