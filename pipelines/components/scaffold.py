"""Scaffold a new block: ``<defs_dir>/<name>/defs.yaml`` from the template of its kind.

``scaffold_block("dataset", "flowers", Path("pipelines/defs"))`` writes a commented defs.yaml
with every field of a DatasetBlock; kinds are ``dataset``, ``training`` and ``pipeline`` (a whole
pipeline, ModelPipelineComponent). The blocks are declared ``@dg.scaffold_with(BlockScaffolder)``,
so Dagster's own scaffolding (``dg scaffold defs pipelines.components.DatasetBlock flowers``)
writes the same file through the same Scaffolder.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
from dagster.components.scaffold.scaffold import NoParams  # what dg passes a scaffolder without params

from pipelines.components.templates import TEMPLATES, render

KINDS = tuple(TEMPLATES)
# core.spec's rule for pipeline names: the folder name becomes the block's name
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class BlockScaffolder(dg.Scaffolder):
    """Writes a block's defs.yaml from the template of its component type; the folder names the block."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        if request.scaffold_format != "yaml" or request.append:
            raise ValueError(f"{request.type_name} blocks are scaffolded as a new defs.yaml of their own "
                             "(format yaml, not appended)")
        kind = _kind_of(request.type_name)
        name = request.target_path.name
        _check_name(name)
        (request.target_path / "defs.yaml").write_text(render(kind, name), encoding="utf-8")


def scaffold_block(kind: str, name: str, defs_dir: Path) -> Path:
    """Write ``<defs_dir>/<name>/defs.yaml`` for a new ``kind`` block and return its path.

    Refuses an unknown kind, a name that is not a pipeline name, a ``defs_dir`` that is not a
    directory, and a folder that already exists (nothing is overwritten).
    """
    if kind not in TEMPLATES:
        raise ValueError(f"unknown block kind {kind!r}; choose one of {list(KINDS)}")
    _check_name(name)
    defs_dir = Path(defs_dir)
    if not defs_dir.is_dir():
        raise NotADirectoryError(f"{defs_dir} is not a directory; give the defs folder the block goes in "
                                 "(e.g. pipelines/defs)")
    folder = defs_dir / name
    if folder.exists():
        raise FileExistsError(f"{folder} already exists; choose another name or edit its defs.yaml")
    folder.mkdir()
    type_name = TEMPLATES[kind][0]
    BlockScaffolder().scaffold(dg.ScaffoldRequest(type_name=type_name, target_path=folder, scaffold_format="yaml",
                                                  project_root=None, params=NoParams()))
    return folder / "defs.yaml"


def _kind_of(type_name: str) -> str:
    # dg may spell the type by the module that defines it or by the package that exports it
    class_name = type_name.rpartition(".")[2]
    kinds = [k for k, (t, _, _) in TEMPLATES.items() if t.rpartition(".")[2] == class_name]
    if not kinds:
        raise ValueError(f"{type_name} has no block template; the block types are "
                         f"{[t for t, _, _ in TEMPLATES.values()]}")
    return kinds[0]


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a block name; use 1-63 lowercase letters, digits and '_', starting "
                         "with a letter (it becomes the pipeline name and its asset key prefix)")
