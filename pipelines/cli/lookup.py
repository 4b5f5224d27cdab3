"""Finding a pipeline by name in the code locations of a workspace, for every command that names one.

The store holds every location's versions under their pipeline names, so the commands that read
versions (``lineage``, ``versions``, ``compare``, ``diff``, ``promote``, ``tensorboard``, ...) need
no location to find them. They ask the workspace only when the store does not know a name, to say
where the pipeline is defined, or which locations were searched. ``train`` runs the pipeline of the
location that defines it; ``predict`` and ``reproduce`` import its team code (a model factory, a task,
a training function) from where that location imports it. ``--location`` picks one location;
``--workspace`` names the workspace file (default: ``workspace.yaml`` in the current directory,
else the repository's).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.registry import UnknownModelVersionError, list_versions
from core.spec import PipelineSpec
from pipelines.cli.errors import UsageError
from pipelines.profiles import REPO_ROOT
from resources.store.base import VersionedStore

if TYPE_CHECKING:
    from pipelines.workspace import BuiltLocation  # imports dagster: the CLI loads it only when it looks

WORKSPACE_FILE = "workspace.yaml"


def default_workspace() -> Path:
    """``workspace.yaml`` in the current directory (as ``dagster dev`` finds it), else the repository's."""
    here = Path.cwd() / WORKSPACE_FILE
    return here if here.is_file() else REPO_ROOT / WORKSPACE_FILE


def workspace_of(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "workspace", None) or default_workspace()).resolve()


@dataclass(frozen=True)
class FoundPipeline:
    spec: PipelineSpec
    location: BuiltLocation

    @property
    def code_paths(self) -> tuple[str, ...]:
        """Folders the location imports its own code from (local workers get them on PYTHONPATH)."""
        return tuple(self.location.profile.code_paths)

    @property
    def specs(self) -> tuple[PipelineSpec, ...]:
        return tuple(self.location.specs)


def find_pipeline(name: str, workspace: Path, location: str | None = None, *, trains: bool = False) -> FoundPipeline:
    """The pipeline ``name`` in the one location of ``workspace`` that defines it (``location`` if
    given); ``trains``: it must train a model. UsageError listing what was searched otherwise."""
    from pipelines.workspace import built_location, read_workspace

    entries = read_workspace(workspace)
    if location is not None:
        entries = [e for e in entries if e.location_name == location]
        if not entries:
            names = ", ".join(e.location_name for e in read_workspace(workspace))
            raise UsageError(f"{workspace} has no code location {location!r}; its locations are {names}")
    found: list[FoundPipeline] = []
    defined: dict[str, list[PipelineSpec]] = {}
    broken: dict[str, str] = {}  # locations that did not load, when searching them all
    for entry in entries:
        try:
            built = built_location(entry)
        except Exception as exc:  # a team's broken location must not hide the others' pipelines
            if location is not None:
                raise
            broken[entry.location_name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        defined[built.name] = list(built.specs)
        found += [FoundPipeline(spec=s, location=built) for s in built.specs if s.name == name]
    unloaded = "; ".join(f"{loc} ({why})" for loc, why in broken.items())
    if len(found) > 1:
        where = " and ".join(repr(f.location.name) for f in found)
        raise UsageError(f"pipeline {name!r} is defined in code locations {where} of {workspace}; choose one with "
                         "--location")
    if not found:
        kind = "model pipeline" if trains else "pipeline"
        listing = "; ".join(f"{loc}: {', '.join(s.name for s in specs if s.trains or not trains) or 'none'}"
                            for loc, specs in defined.items())
        raise UsageError(f"no {kind} named {name!r} in code location(s) {', '.join(defined) or 'none'} of "
                         f"{workspace} (they define {listing or 'nothing'})"
                         + (f"; these did not load: {unloaded}" if broken else ""))
    if broken:
        print(f"note: {name!r} was found, but these code locations did not load and were not searched: {unloaded}",
              file=sys.stderr)
    (hit,) = found
    if trains and not hit.spec.trains:
        trainers = [s.name for loc, specs in defined.items() for s in specs if s.dataset == name
                    and (s.dataset_location or loc) == hit.location.name]
        raise UsageError(f"pipeline {name!r} (code location {hit.location.name!r}) prepares a dataset and trains no "
                         "model; " + (f"the pipeline(s) that train on it: {', '.join(trainers)} (e.g. `python -m "
                                      f"pipelines train {trainers[0]}`)" if trainers else
                                      f"no pipeline trains on it yet: declare one with dataset={name!r}"))
    return hit


def require_model(args: argparse.Namespace, store: VersionedStore) -> None:
    """Before a command reads a model's versions: with ``--location``, the location must define it;
    a name the store has no versions of is looked up in the workspace, so the error says where the
    pipeline is (and that it has not registered yet) or which locations were searched."""
    model, location = args.model, getattr(args, "location", None)
    if location is not None:
        find_pipeline(model, workspace_of(args), location)
    try:
        if list_versions(store, model):
            return
    except UnknownModelVersionError:
        pass  # the store has no repository yet, so no versions of any model: the lookup below says so
    found = find_pipeline(model, workspace_of(args), location)
    raise UnknownModelVersionError(
        f"model {model!r} (code location {found.location.name!r}) has no registered versions yet; train it with "
        f"`python -m pipelines train {model}` or run its job {model}_training")


def require_dataset(args: argparse.Namespace, dataset: str, published: bool) -> None:
    """A dataset name must be published by a location of the workspace (``--location``'s if given),
    unless the store already has published versions of it."""
    location = getattr(args, "location", None)
    if published and location is None:
        return
    found = find_pipeline(dataset, workspace_of(args), location)
    if found.spec.dataset is not None:
        raise UsageError(f"pipeline {dataset!r} (code location {found.location.name!r}) trains on dataset "
                         f"{found.spec.dataset!r}; `datasets {found.spec.dataset}` lists its versions")


def model_code(args: argparse.Namespace, model: str, config: dict) -> tuple[str, ...]:
    """The folders a registered model's team code imports from, put on this process's sys.path too;
    () when its recorded config (``training.config``) names only built-in code."""
    refs = [(config.get("model") or {}).get("name"), config.get("task"), config.get("train_fn")]
    if getattr(args, "location", None) is None and not any(isinstance(r, str) and ":" in r for r in refs):
        return ()
    found = find_pipeline(model, workspace_of(args), getattr(args, "location", None))
    for path in reversed(found.code_paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    return found.code_paths
