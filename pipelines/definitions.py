"""The platform's own code location ("platform"): its model pipelines' assets, jobs, schedules and
sensors. Teams add theirs in their own packages and locations (pipelines/api.py)."""

from __future__ import annotations

import dagster as dg

from core.spec import PipelineSpec
from ops.housekeeping import housekeeping_definitions
from pipelines.alerts import alert_definitions
from pipelines.assembly import location_definitions, training_job_name  # noqa: F401 (re-exported)
from pipelines.models import PIPELINES
from pipelines.profiles import Profile

PLATFORM_LOCATION = "platform"  # its location_name in workspace.yaml


def build_definitions(profile: Profile, pipelines: list[PipelineSpec], with_yaml: bool = True) -> dg.Definitions:
    """``pipelines`` plus, with ``with_yaml``, those declared in pipelines/defs/ whose data is here."""
    names = [p.name for p in pipelines]
    if with_yaml:
        from pipelines.components import yaml_pipelines

        yaml = yaml_pipelines()
        # A YAML pipeline sharing a dataset joins only where that dataset is (tests build locations
        # without digits); one reading another location's published dataset always can.
        here = names + [y.name for y in yaml if y.dataset is None]
        pipelines = [*pipelines, *[y for y in yaml if y.dataset is None or y.published_elsewhere or y.dataset in here]]
    return dg.Definitions.merge(location_definitions(PLATFORM_LOCATION, pipelines, profile),
                                housekeeping_definitions(), alert_definitions())


defs = build_definitions(Profile.from_environment(), PIPELINES)
