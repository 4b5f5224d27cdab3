"""The code location: every model pipeline's assets, jobs, schedules and sensors."""

from __future__ import annotations

import dagster as dg

from assets.pipeline import build_pipeline_assets
from assets.spec import PipelineSpec
from pipelines.models import PIPELINES
from pipelines.profiles import Profile


def training_job_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_training"


def build_definitions(profile: Profile, pipelines: list[PipelineSpec]) -> dg.Definitions:
    names = [p.name for p in pipelines]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"pipeline name(s) {duplicates} are defined twice; each pipeline needs its own name")
    assets, jobs = [], []
    for spec in pipelines:
        assets.extend(build_pipeline_assets(spec))
        jobs.append(dg.define_asset_job(training_job_name(spec), selection=dg.AssetSelection.groups(spec.name),
                                        description=f"Ingest, shard, train, evaluate and register {spec.name}."))
    return dg.Definitions(assets=assets, jobs=jobs, resources=profile.resources(), executor=profile.executor())


defs = build_definitions(Profile.from_environment(), PIPELINES)
