"""Turn pipeline specs into Dagster definitions: assets, the training job, schedule and sensor.

Shared by the platform's code location (pipelines/definitions.py), the YAML component
(pipelines/components) and team code locations (pipelines/api.py).
"""

from __future__ import annotations

import dagster as dg

from assets.pipeline import build_pipeline_assets, pipeline_asset_keys
from core.spec import PipelineSpec, resolve_shared
from pipelines.automation import build_new_data_sensor, build_schedule, run_tags


def training_job_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_training"


def training_job(spec: PipelineSpec, specs: list[PipelineSpec]) -> dg.UnresolvedAssetJobDefinition:
    """A pipeline's whole graph; an owner's job also trains the models that share its shards, so they
    all see the same commit."""
    keys = pipeline_asset_keys(spec)
    selection = dg.AssetSelection.assets(keys["checkpoint"], keys["model_version"])
    if not spec.dataset:
        selection = dg.AssetSelection.groups(spec.name) | dg.AssetSelection.groups(
            *[s.name for s in specs if s.dataset == spec.name])
    return dg.define_asset_job(training_job_name(spec), selection=selection, tags=run_tags(spec, "ad_hoc"),
                               description=f"Ingest, shard, train, evaluate and register {spec.name}.")


def pipeline_definitions(specs: list[PipelineSpec], owners: list[PipelineSpec] = ()) -> dg.Definitions:
    """Assets, jobs, schedules and sensors of ``specs`` (without resources); ``owners`` only resolve
    shared datasets."""
    mine = {s.name for s in specs}
    specs = resolve_shared([*owners, *specs])
    assets, jobs, schedules, sensors = [], [], [], []
    for spec in [s for s in specs if s.name in mine]:
        job = training_job(spec, specs)
        assets.extend(build_pipeline_assets(spec))
        jobs.append(job)
        schedules += [d for d in [build_schedule(spec, job, specs)] if d]
        sensors += [d for d in [build_new_data_sensor(spec, job, specs)] if d]
    return dg.Definitions(assets=assets, jobs=jobs, schedules=schedules, sensors=sensors)
