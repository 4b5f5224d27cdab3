"""Checks across the code locations of a workspace: names are unique, shared datasets exist.

Dagster loads each code location on its own, so no location can see a clash with another. This
module loads every location that ``workspace.yaml`` lists, reads what each defines (recorded by
``pipelines.assembly.location_definitions``), and refuses:
- a pipeline name defined in two locations (asset keys would collide);
- a dataset published by two locations (both would write ``datasets/<name>/`` on main);
- a ``dataset_location`` that does not publish that dataset;
- a ``location_name`` that differs from the name the location's definitions were built with.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from core.spec import PipelineDefinitionError
from pipelines.assembly import location_listing


@dataclass(frozen=True)
class LocationEntry:
    """One ``python_module`` entry of workspace.yaml."""

    location_name: str
    module_name: str
    attribute: str
    working_directory: Path


def read_workspace(path: Path) -> list[LocationEntry]:
    doc = yaml.safe_load(path.read_text()) or {}
    entries = []
    for i, item in enumerate(doc.get("load_from") or []):
        target = item.get("python_module") if isinstance(item, dict) else None
        if target is None:
            raise PipelineDefinitionError(f"{path}: load_from[{i}] is not a python_module entry; the platform's "
                                          "locations are Python modules (see pipelines/api.py)")
        if isinstance(target, str):
            target = {"module_name": target}
        module = target["module_name"]
        attribute = target.get("attribute", "defs")
        entries.append(LocationEntry(
            location_name=target.get("location_name") or f"{module}:{attribute}", module_name=module,
            attribute=attribute, working_directory=(path.parent / target.get("working_directory", ".")).resolve()))
    return entries


def load_listings(entries: list[LocationEntry]) -> dict[str, list[dict]]:
    """{location: pipelines it defines}, importing each location's module as Dagster would."""
    out: dict[str, list[dict]] = {}
    for entry in entries:
        if str(entry.working_directory) not in sys.path:
            sys.path.insert(0, str(entry.working_directory))
        defs = getattr(importlib.import_module(entry.module_name), entry.attribute)
        built_as, pipelines = location_listing(defs)
        if built_as != entry.location_name:
            raise PipelineDefinitionError(
                f"code location {entry.location_name!r} ({entry.module_name}) was built as {built_as!r}; give "
                f"team_definitions the location_name workspace.yaml uses, or rename the entry")
        out[entry.location_name] = pipelines
    return out


def workspace_problems(listings: dict[str, list[dict]]) -> list[str]:
    """Everything that clashes across locations, each naming both locations and the fix."""
    problems = []
    pipeline_home: dict[str, str] = {}
    dataset_home: dict[str, str] = {}
    for location, pipelines in listings.items():
        for p in pipelines:
            if p["name"] in pipeline_home:
                problems.append(f"pipeline {p['name']!r} is defined in code locations {pipeline_home[p['name']]!r} "
                                f"and {location!r}; rename one (pipeline names are asset key prefixes)")
            pipeline_home.setdefault(p["name"], location)
            if p["dataset"] is None:
                if p["name"] in dataset_home:
                    problems.append(f"dataset {p['name']!r} is published by code locations "
                                    f"{dataset_home[p['name']]!r} and {location!r}; rename one")
                dataset_home.setdefault(p["name"], location)
    for location, pipelines in listings.items():
        for p in pipelines:
            owner = p.get("dataset_location")
            if owner is not None and dataset_home.get(p["dataset"]) != owner:
                where = (f"it is published by {dataset_home[p['dataset']]!r}" if p["dataset"] in dataset_home
                         else "no location in this workspace publishes it")
                problems.append(f"pipeline {p['name']!r} in code location {location!r} reads dataset {p['dataset']!r} "
                                f"from code location {owner!r}, but {where}; fix its dataset_location")
    return problems


def check_workspace(path: Path) -> dict[str, list[dict]]:
    """Load and check every location of ``path``; raise with every problem found."""
    listings = load_listings(read_workspace(path))
    problems = workspace_problems(listings)
    if problems:
        raise PipelineDefinitionError(f"{path}: " + "; ".join(problems))
    return listings
