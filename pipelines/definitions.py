"""The code location: every model pipeline's assets, jobs, schedules and sensors."""

from __future__ import annotations

import dagster as dg

from assets.pipeline import build_pipeline_assets, pipeline_asset_keys
from assets.spec import PipelineDefinitionError, PipelineSpec, resolve_shared
from pipelines.automation import build_new_data_sensor, build_schedule, run_tags
from pipelines.models import PIPELINES
from pipelines.profiles import Profile


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


def build_definitions(profile: Profile, pipelines: list[PipelineSpec], with_yaml: bool = True) -> dg.Definitions:
    """``pipelines`` plus, with ``with_yaml``, those declared in pipelines/defs/ whose data is here."""
    names = [p.name for p in pipelines]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineDefinitionError(f"pipeline {duplicates[0]!r}, field 'name': is defined twice; each pipeline "
                                      "needs its own name (pipeline names are also asset key prefixes)")
    if with_yaml:
        from pipelines.components import yaml_pipelines

        pipelines = [*pipelines, *[y for y in yaml_pipelines() if y.dataset is None or y.dataset in names]]
    return dg.Definitions.merge(pipeline_definitions(pipelines), dg.Definitions(
        resources=profile.resources(), executor=profile.executor()))


defs = build_definitions(Profile.from_environment(), PIPELINES)
