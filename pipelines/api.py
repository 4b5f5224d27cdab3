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

The team's code may live anywhere its location can import it from (the ``working_directory``
above, a folder outside the repository, an installed package): local training workers get the
folders it is imported from first on their PYTHONPATH (``location_code_paths``), and pods run the
training image, which carries the team's code (helm/images/training.Dockerfile, ``USER_CODE``).
A pipeline that names no ``team`` is tagged with its location's name (``platform/team``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import sysconfig
from pathlib import Path
from typing import Any, Mapping, Sequence

import dagster as dg

from core.expectations import standard_raw_expectations, standard_shard_expectations
from core.spec import (
    Guards,
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

__all__ = ["Choice", "FloatRange", "IntRange", "LogRange", "Range", "Sweep", "Guards", "ImageFolder", "ImagePreprocessing", "PipelineDefinitionError", "PipelineSpec", "QualityGate",
           "QualitySuite", "Recipe", "Source", "Split", "TextCorpus", "TextPreprocessing", "Triggers", "dataset_pipeline", "model_pipeline", "standard_raw_expectations", "standard_shard_expectations",
           "location_code_paths", "location_team", "team_definitions"]


# The team a pipeline that names none belongs to (PipelineSpec.team's default): the platform's own.
PLATFORM_TEAM = next(f.default for f in dataclasses.fields(PipelineSpec) if f.name == "team")


def team_definitions(location: str, pipelines: Sequence[PipelineSpec], *,
                     profile: Profile | None = None, code_paths: Sequence[str | Path] | None = None) -> dg.Definitions:
    """A team's code location named ``location`` (its ``location_name`` in workspace.yaml).

    Each pipeline gets its four assets (two when it trains on a shared dataset), a training job,
    a schedule and a new-data sensor, with the resources of the one environment switch
    (``PLATFORM_PROFILE``) unless ``profile`` is given. Pipelines that name no team are the
    location's (``location_team``). ``code_paths``: the folders local training workers import the
    team's code from; by default those the calling module and the pipelines' import paths
    (``train``, ``task``, ``model``) are imported from here (``location_code_paths``).
    """
    caller = sys._getframe(1).f_globals  # the location's definitions module, as Dagster imports it
    roots = (tuple(str(Path(p).resolve()) for p in code_paths) if code_paths is not None
             else location_code_paths(pipelines, caller))
    team = location_team(location)
    specs = [dataclasses.replace(p, team=team) if p.team == PLATFORM_TEAM else p for p in pipelines]
    return location_definitions(location, specs,
                                dataclasses.replace(profile or Profile.from_environment(), code_paths=roots))


def location_team(location: str) -> str:
    """The team a location's pipelines are tagged with when they name none: its name, as a team
    name (lowercase, '-' as '_')."""
    return location.lower().replace("-", "_")


def location_code_paths(pipelines: Sequence[PipelineSpec], module_globals: Mapping[str, Any]) -> tuple[str, ...]:
    """The folders this process imports a location's own code from: the root of the module that
    defines the location (``module_globals``: its ``__name__`` and ``__file__``) and of every module
    its pipelines name by import path. Folders of the interpreter and its installed packages are
    left out: workers of the same interpreter import those anyway."""
    roots: list[Path] = []
    file, name = module_globals.get("__file__"), module_globals.get("__name__") or ""
    if file and name and name != "__main__":
        # team_pkg/definitions.py as "team_pkg.definitions" (or team_pkg/__init__.py as "team_pkg")
        # lies one folder below its root per package level.
        levels = name.count(".") + (Path(file).stem == "__init__")
        roots.append(Path(file).resolve().parents[levels])
    for spec in pipelines:
        for ref in (spec.train, spec.task, spec.model):
            if isinstance(ref, str) and ":" in ref:
                root = _import_root(ref.partition(":")[0].split(".")[0])
                if root is not None:
                    roots.append(root)
    installed = {Path(p).resolve() for key, p in sysconfig.get_paths().items()
                 if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(dict.fromkeys(str(r) for r in roots if r not in installed))


def _import_root(top: str) -> Path | None:
    """The sys.path folder top-level module ``top`` is found in here; None when it is not found
    (definitions then refuse the import path, core/spec.py) or is not a file on disk."""
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    if found.submodule_search_locations:  # a package: its folder's parent
        return Path(next(iter(found.submodule_search_locations))).resolve().parent
    return Path(found.origin).resolve().parent if found.origin and found.has_location else None
