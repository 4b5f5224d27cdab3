"""The code location: every model pipeline's assets, jobs, schedules and sensors."""

from __future__ import annotations

import dagster as dg

from core.spec import PipelineDefinitionError, PipelineSpec
from pipelines.assembly import pipeline_definitions, training_job_name  # noqa: F401 (re-exported)
from pipelines.models import PIPELINES
from pipelines.profiles import Profile


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
