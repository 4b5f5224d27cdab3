"""Turn pipeline specs into Dagster definitions: assets, the training job, schedule and sensor.

Shared by the platform's code location (pipelines/definitions.py), the YAML component
(pipelines/components) and team code locations (pipelines/api.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Sequence

import dagster as dg

from assets.pipeline import build_pipeline_assets, build_pipeline_checks, pipeline_asset_keys, published_dataset_specs
from core.spec import PipelineDefinitionError, PipelineSpec, resolve_shared
from core.sweep import check_sweep_capacity
from pipelines.automation import build_new_data_sensor, build_schedule, run_tags
from pipelines.profiles import Profile

# Definitions metadata naming what a code location defines, for the cross-location checks
# (pipelines/workspace.py): pipeline and dataset names must be unique across a workspace.
LOCATION_KEY, PIPELINES_KEY = "platform/location", "platform/pipelines"
# ...and the handle of this build's specs and profile in BUILDS, through which the CLI finds the
# pipeline objects of a location it imported (pipelines/workspace.py built_location). Metadata
# survives Definitions.merge; the handle is unique per build, so another build of a location of
# the same name in this process never answers for this one.
BUILD_KEY = "platform/build"
BUILDS: dict[str, tuple[tuple[PipelineSpec, ...], Profile]] = {}


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
    what = (f"Ingest, shard, train, evaluate and register {spec.name}" if spec.trains else
            f"Ingest and shard {spec.name}, and train the pipelines of this location that read it")
    return dg.define_asset_job(training_job_name(spec), selection=selection, tags=run_tags(spec, "ad_hoc"),
                               description=what + ".")


def pipeline_definitions(specs: list[PipelineSpec], owners: list[PipelineSpec] = ()) -> dg.Definitions:
    """Assets, jobs, schedules and sensors of ``specs`` (without resources); ``owners`` only resolve
    shared datasets."""
    mine = {s.name for s in specs}
    specs = resolve_shared([*owners, *specs])
    assets, checks, jobs, schedules, sensors = [], [], [], [], []
    for spec in [s for s in specs if s.name in mine]:
        job = training_job(spec, specs)
        assets.extend(build_pipeline_assets(spec))
        checks.extend(build_pipeline_checks(spec))
        assets.extend(a for a in published_dataset_specs(spec) if a.key not in {x.key for x in assets})
        jobs.append(job)
        schedules += [d for d in [build_schedule(spec, job, specs)] if d]
        sensors += [d for d in [build_new_data_sensor(spec, job, specs)] if d]
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs, schedules=schedules, sensors=sensors)


def location_definitions(location: str, pipelines: Sequence[PipelineSpec], profile: Profile) -> dg.Definitions:
    """One code location: ``pipelines`` (marked as defined in ``location``) with the profile's
    resources and executor, and metadata listing its pipelines and the datasets it publishes."""
    names = [p.name for p in pipelines]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineDefinitionError(f"pipeline {duplicates[0]!r}, field 'name': is defined twice in code location "
                                      f"{location!r}; each pipeline needs its own name (pipeline names are also "
                                      "asset key prefixes)")
    specs = [replace(p, location=location) for p in pipelines]
    for spec in specs:  # parallel sweep trials must fit the GPU pool (core/sweep.py)
        check_sweep_capacity(spec, profile.gpu_pool)
    listing = [{"name": s.name, "dataset": s.dataset, "dataset_location": s.dataset_location} for s in specs]
    handle = f"{location}:{uuid.uuid4().hex}"
    BUILDS[handle] = (tuple(specs), profile)
    return dg.Definitions.merge(
        pipeline_definitions(specs),
        dg.Definitions(resources=profile.resources(), executor=profile.executor(),
                       metadata={LOCATION_KEY: location, PIPELINES_KEY: dg.MetadataValue.json(listing),
                                 BUILD_KEY: handle}))


def location_listing(defs: dg.Definitions) -> tuple[str, list[dict]]:
    """(location, pipelines) recorded by ``location_definitions`` in a location's definitions."""
    meta = defs.metadata or {}
    if LOCATION_KEY not in meta:
        raise PipelineDefinitionError("these definitions were not built by the platform (pipelines.api."
                                      "team_definitions); build them with it so names can be checked")
    pipelines = meta[PIPELINES_KEY].value
    return meta[LOCATION_KEY].value, json.loads(pipelines) if isinstance(pipelines, str) else list(pipelines)
