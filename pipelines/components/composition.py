"""The blocks declared under a defs module, as a Dagster component tree and as PipelineSpecs."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

import dagster as dg

from core.spec import PipelineSpec
from pipelines.components.blocks import Block, refuse_duplicate_name
from pipelines.components.graph import PLATFORM_DEFS_MODULE, check_composition
from pipelines.components.located import errors_located

DEFS_MODULE = PLATFORM_DEFS_MODULE
REPO_ROOT = Path(__file__).resolve().parents[2]


def load_component_tree(defs_module: str = DEFS_MODULE, project_root: Path = REPO_ROOT) -> dg.ComponentTree:
    return dg.ComponentTree.from_module(defs_module=importlib.import_module(defs_module), project_root=project_root)


def yaml_pipelines(defs_module: str = DEFS_MODULE, project_root: Path = REPO_ROOT,
                   alongside: Sequence[PipelineSpec] | None = None) -> list[PipelineSpec]:
    """The specs of every block (dataset, training, whole pipeline) declared under ``defs_module``.

    Checked as a whole: names are unique, and a training block naming a dataset block of the
    tree composes with it (resolve_shared, as the code location does). ``alongside``: the other
    pipelines of the code location; given, a block naming a dataset that neither a block nor one
    of them declares is refused. Errors name the block's file, line and field.
    """
    blocks = load_component_tree(defs_module, project_root).get_all_components(of_type=Block)
    for block in blocks:
        refuse_duplicate_name(block, blocks)
    specs = [block.to_spec() for block in blocks]
    with errors_located(blocks):
        check_composition(specs, alongside)
    return specs
