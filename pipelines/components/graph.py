"""How the specs of YAML blocks compose into one graph, at the level of PipelineSpecs.

Two ways load blocks: the platform's code location collects their specs (``yaml_pipelines``)
and assembles them with its Python pipelines; Dagster loading a defs folder itself asks each
block for its own definitions (``Block.build_defs``) and merges them. Both must draw the same
graph: one raw_dataset/shards pair per dataset, feeding every model that trains on it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Collection, Sequence

import dagster as dg

from assets.pipeline import asset_keys
from core.spec import PipelineDefinitionError, PipelineSpec, resolve_shared
from pipelines.assembly import pipeline_definitions
from pipelines.profiles import Profile

# The platform's own defs folder: only there do blocks share the code location with the Python
# pipelines of pipelines/models (pipelines/definitions.py), so only there may they name them.
PLATFORM_DEFS_MODULE = "pipelines.defs"


def check_dataset_source(spec: PipelineSpec, names: Collection[str], datasets: Collection[str]) -> None:
    """Where a block's dataset comes from must match what this location declares (``names``: every
    pipeline and block here; ``datasets``: those that declare their own data): a dataset of this
    location must be declared here, and one read from another location must not be (dataset names
    are unique across the workspace, so it would be this location's own)."""
    if spec.dataset is None:
        return
    if spec.published_elsewhere:
        if spec.dataset in names:
            raise PipelineDefinitionError(
                f"pipeline {spec.name!r}, field 'dataset_location': {spec.dataset!r} is declared in this code "
                "location; leave dataset_location out to train on it here")
        return
    if spec.dataset in names:
        return  # resolve_shared says more if it names a model rather than a dataset
    here = f"the datasets here are {sorted(datasets)}" if datasets else "none is"
    raise PipelineDefinitionError(
        f"pipeline {spec.name!r}, field 'dataset': no dataset named {spec.dataset!r} is declared here ({here}). "
        "For a dataset another team's code location publishes, add dataset_location: <that location>")


def check_composition(specs: Sequence[PipelineSpec], alongside: Sequence[PipelineSpec] | None) -> None:
    """Check that the blocks' specs compose, as the code location will compose them.

    ``alongside``: the other pipelines of the location (its Python ones). Given, every dataset a
    block names must be declared by a block or one of them; None, a block naming a dataset that
    no block declares is left to the location to check. Whether another location publishes a
    dataset is checked across the workspace (``python -m pipelines workspace``).
    """
    others = list(alongside or [])
    here = [*specs, *others]
    names = {s.name for s in here}
    datasets = {s.name for s in here if s.dataset is None}
    tree_names = {s.name for s in specs}
    for spec in specs:
        if alongside is not None or spec.published_elsewhere or spec.dataset in tree_names:
            check_dataset_source(spec, names, datasets)
    resolvable = [s for s in specs if s.dataset is None or (not s.published_elsewhere and s.dataset in names)]
    resolve_shared([*others, *resolvable])  # names defined twice, a model named as a dataset


def block_definitions(spec: PipelineSpec, related: Sequence[PipelineSpec], platform: Sequence[PipelineSpec],
                      profile: Profile) -> dg.Definitions:
    """The definitions of one block, to merge with those of the other blocks of its defs folder.

    ``related``: the specs of the blocks it shares data with (its dataset's block, or the blocks
    training on its data); ``platform``: Python pipelines of the location whose data a block may
    name. Their assets are not built here: they appear as upstream assets built elsewhere.
    """
    related_names = {s.name for s in related}
    owners_elsewhere = [p for p in platform if p.name == spec.dataset and p.name not in related_names
                        and not spec.published_elsewhere]
    upstream = [dg.AssetSpec(asset_keys(owner.name)[stage], description=f"Produced by the {owner.name} pipeline.")
                for owner in owners_elsewhere for stage in ("raw_dataset", "shards")]
    resources, executor = _location_runtime(profile)
    return dg.Definitions.merge(
        pipeline_definitions([spec], owners=[*related, *owners_elsewhere]),
        dg.Definitions(assets=upstream, resources=resources, executor=executor))


@lru_cache(maxsize=None)
def _location_runtime(profile: Profile) -> tuple[dict[str, dg.ConfigurableResource], dg.ExecutorDefinition]:
    """One set of resources and one executor per profile: Dagster merges the blocks' definitions
    only when they hold the very same resource and executor objects."""
    return profile.resources(), profile.executor()
