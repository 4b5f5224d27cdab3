"""Checks across the code locations of a workspace: names are unique, shared datasets exist.

Dagster loads each code location on its own, so no location can see a clash with another. This
module loads every location that ``workspace.yaml`` lists (``python_module`` and ``python_file``
entries, imported as Dagster imports them), reads what each defines (recorded by
``pipelines.assembly.location_definitions``; ``built_location`` also finds the pipeline objects,
for the CLI), and refuses:
- a pipeline name defined in two locations (asset keys would collide);
- a dataset published by two locations (both would write ``datasets/<name>/`` on main);
- a ``dataset_location`` that does not publish that dataset;
- a ``location_name`` that differs from the name the location's definitions were built with.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import yaml

from core.spec import PipelineDefinitionError, PipelineSpec
from pipelines.assembly import BUILD_KEY, BUILDS, location_listing
from pipelines.profiles import Profile


@dataclass(frozen=True)
class LocationEntry:
    """One ``python_module`` or ``python_file`` entry of workspace.yaml."""

    location_name: str
    module_name: str | None  # python_module entries
    attribute: str
    working_directory: Path  # put on sys.path while the location is imported, as Dagster does
    python_file: Path | None = None  # python_file entries

    def describe(self) -> str:
        what = f"module {self.module_name}" if self.python_file is None else f"file {self.python_file}"
        return f"{self.location_name} ({what}, working directory {self.working_directory})"


def read_workspace(path: Path) -> list[LocationEntry]:
    """The entries of workspace.yaml ``path``, paths resolved against its folder."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise PipelineDefinitionError(f"workspace file {path} does not exist; give the one `dagster dev -w` reads "
                                      "with --workspace") from None
    entries = []
    for i, item in enumerate(doc.get("load_from") or []):
        if isinstance(item, dict) and "python_file" in item:
            entries.append(_file_entry(path, item["python_file"]))
            continue
        target = item.get("python_module") if isinstance(item, dict) else None
        if target is None:
            raise PipelineDefinitionError(f"{path}: load_from[{i}] is neither a python_module nor a python_file "
                                          "entry; the platform's locations are Python code (see pipelines/api.py)")
        if isinstance(target, str):
            target = {"module_name": target}
        module = target["module_name"]
        attribute = target.get("attribute", "defs")
        entries.append(LocationEntry(
            location_name=target.get("location_name") or f"{module}:{attribute}", module_name=module,
            attribute=attribute, working_directory=(path.parent / target.get("working_directory", ".")).resolve()))
    return entries


def _file_entry(path: Path, target) -> LocationEntry:
    """A python_file entry: its working directory defaults to the workspace file's folder, as in Dagster."""
    if isinstance(target, str):
        target = {"relative_path": target}
    file = (path.parent / target["relative_path"]).resolve()
    return LocationEntry(location_name=target.get("location_name") or file.name, module_name=None,
                         attribute=target.get("attribute", "defs"), python_file=file,
                         working_directory=(path.parent / target.get("working_directory", ".")).resolve())


def import_location(entry: LocationEntry) -> dg.Definitions:
    """A location's definitions, imported as Dagster's code server imports them (its working
    directory on sys.path). The folder stays on sys.path, so the location's code imports later in
    this process too (a training op checking user code, a model card naming a team's task)."""
    if str(entry.working_directory) not in sys.path:
        sys.path.insert(0, str(entry.working_directory))
    if entry.python_file is not None and not entry.python_file.is_file():
        raise PipelineDefinitionError(f"code location {entry.describe()}: {entry.python_file} does not exist; fix the "
                                      "entry's relative_path (relative to the workspace file)")
    try:
        if entry.python_file is not None:
            module = _import_file(entry.python_file)
        else:
            module = importlib.import_module(entry.module_name)
    except ImportError as exc:
        raise PipelineDefinitionError(f"code location {entry.describe()} cannot be imported: {exc}; fix the "
                                      "workspace entry or the location's code") from exc
    defs = getattr(module, entry.attribute, None)
    if not isinstance(defs, dg.Definitions):
        raise PipelineDefinitionError(f"code location {entry.describe()} has no Definitions named "
                                      f"{entry.attribute!r}; set the entry's attribute to the name of its defs")
    return defs


def _import_file(file: Path):
    name = f"{file.stem}_{abs(hash(str(file)))}"  # one module per file, never another location's
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@dataclass(frozen=True)
class BuiltLocation:
    """A code location as this process imported it: its pipelines and the profile it was built with
    (whose ``code_paths`` the location's local training workers import its code from)."""

    entry: LocationEntry
    specs: tuple[PipelineSpec, ...]
    profile: Profile

    @property
    def name(self) -> str:
        return self.entry.location_name


def built_location(entry: LocationEntry) -> BuiltLocation:
    """Import ``entry`` and find the pipelines its definitions were built from."""
    defs = import_location(entry)
    built_as, _ = location_listing(defs)
    if built_as != entry.location_name:
        raise PipelineDefinitionError(
            f"code location {entry.location_name!r} ({entry.module_name or entry.python_file}) was built as "
            f"{built_as!r}; give team_definitions the location_name workspace.yaml uses, or rename the entry")
    handle = (defs.metadata or {}).get(BUILD_KEY)
    handle = getattr(handle, "value", handle)
    if handle not in BUILDS:
        raise PipelineDefinitionError(f"code location {entry.location_name!r} was built by a platform version that "
                                      "records no pipelines; rebuild it with pipelines.api.team_definitions")
    specs, profile = BUILDS[handle]
    return BuiltLocation(entry=entry, specs=specs, profile=profile)


def load_listings(entries: list[LocationEntry]) -> dict[str, list[dict]]:
    """{location: pipelines it defines}, importing each location's module as Dagster would."""
    out: dict[str, list[dict]] = {}
    for entry in entries:
        built_as, pipelines = location_listing(import_location(entry))
        if built_as != entry.location_name:
            raise PipelineDefinitionError(
                f"code location {entry.location_name!r} ({entry.module_name or entry.python_file}) was built as "
                f"{built_as!r}; give team_definitions the location_name workspace.yaml uses, or rename the entry")
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
