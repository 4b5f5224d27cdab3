"""The platform's public API: the one module a team's code location imports.

A team keeps its pipelines in its own package and code location; nothing of the platform is
edited. ``team_pkg/definitions.py``::

    from pipelines.api import model_pipeline, team_definitions

    digits_wide = model_pipeline(
        "digits_wide", dataset="digits", dataset_location="platform",   # another team's dataset
        model="mlp", model_kwargs={"hidden_sizes": [256]}, recipe={"epochs": 4, "world_size": 2},
        gate={"min_test_accuracy": 0.85}, team="vision")

    defs = team_definitions("vision", [digits_wide])

and one more entry in ``workspace.yaml``::

    - python_module:
        module_name: team_pkg.definitions
        attribute: defs
        location_name: vision          # the same name team_definitions was given
        working_directory: .

``python -m pipelines workspace`` then checks every location in the workspace: pipeline and
dataset names unique across locations, every ``dataset_location`` naming a location that
publishes that dataset.
"""

from __future__ import annotations

from typing import Sequence

import dagster as dg

from core.expectations import standard_raw_expectations, standard_shard_expectations
from core.spec import (
    ImageFolder,
    ImagePreprocessing,
    PipelineDefinitionError,
    PipelineSpec,
    QualityGate,
    QualitySuite,
    Recipe,
    Source,
    Split,
    TextCorpus,
    TextPreprocessing,
    Triggers,
    dataset_pipeline,
    model_pipeline,
)
from core.sweep import Choice, FloatRange, IntRange, LogRange, Range, Sweep
from pipelines.assembly import location_definitions
from pipelines.profiles import Profile

__all__ = ["Choice", "FloatRange", "IntRange", "LogRange", "Range", "Sweep", "ImageFolder", "ImagePreprocessing", "PipelineDefinitionError", "PipelineSpec", "QualityGate",
           "QualitySuite", "Recipe", "Source", "Split", "TextCorpus", "TextPreprocessing", "Triggers", "dataset_pipeline", "model_pipeline", "standard_raw_expectations", "standard_shard_expectations",
           "team_definitions"]


def team_definitions(location: str, pipelines: Sequence[PipelineSpec], *,
                     profile: Profile | None = None) -> dg.Definitions:
    """A team's code location named ``location`` (its ``location_name`` in workspace.yaml).

    Each pipeline gets its four assets (two when it trains on a shared dataset), a training job,
    a schedule and a new-data sensor, with the resources of the one environment switch
    (``PLATFORM_PROFILE``) unless ``profile`` is given.
    """
    return location_definitions(location, pipelines, profile or Profile.from_environment())
