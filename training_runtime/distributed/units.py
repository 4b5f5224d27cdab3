"""Which modules FSDP shards as their own units, and recomputes in the backward pass when
activation checkpointing is on.

A unit's parameters are all-gathered just before its forward (and again for its backward) and
freed after, so a rank's peak holds its shard of everything plus a unit or two in full. A model
that is one unit, the root, holds every parameter on every rank for the whole step: FSDP then
saves only the gradients' and optimizer's memory. Units come from, in order:

- ``names``: module class names (``type(m).__name__``, or ``module.QualName``) the pipeline
  gives (``recipe.fsdp_units``), e.g. ``GPT2Block`` for a Hugging Face model;
- the platform's own models: their blocks (``models.builtin.shardable_submodules``);
- any other model: a size-based policy. From the root down, a module of at most ``max_params``
  parameters (``recipe.fsdp_unit_params``; default a sixteenth of the model's, at least 2**20) that holds at
  least a quarter of that becomes a unit; a larger one is split into its children; smaller ones
  stay with their parent. Containers (``ModuleList``, ``ModuleDict``) are never units, and a
  module whose parameters are shared with one outside it (tied embeddings and heads) is not
  either: FSDP cannot shard a parameter into two units.

For a transformer that is each block: its layers stack holds many blocks of equal size, each
well below a sixteenth of the model for a dozen layers or more.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import nn

from training_runtime.config import ConfigError
from training_runtime.models.builtin import shardable_submodules

log = logging.getLogger(__name__)

BUILTIN_MODULE = "training_runtime.models.builtin"
_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def parse_unit_names(text: str | None) -> tuple[str, ...]:
    """``recipe.fsdp_units``' comma-separated class names as a tuple (empty: the default policy)."""
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


def fsdp_units(model: nn.Module, names: Sequence[str] = (), max_params: int | None = None) -> list[nn.Module]:
    """The model's units, inner ones before the modules that hold them (the order ``fully_shard``
    needs); the root itself is never in the list (it takes what no unit holds)."""
    if names:
        units = _by_class_names(model, names)
    elif type(model).__module__ == BUILTIN_MODULE:
        units = shardable_submodules(model)
    else:
        units = _by_size(model, max_params)
    order = {id(m): i for i, m in enumerate(_post_order(model))}
    return sorted(units, key=lambda m: order[id(m)])


def _class_names(module: nn.Module) -> tuple[str, str]:
    cls = type(module)
    return cls.__name__, f"{cls.__module__}.{cls.__qualname__}"


def _by_class_names(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    wanted = set(names)
    units = [m for m in model.modules() if m is not model and wanted & set(_class_names(m))]
    found = {n for m in units for n in _class_names(m)}
    missing = sorted(wanted - found)
    if missing:
        present = sorted({type(m).__name__ for m in model.modules() if m is not model})
        raise ConfigError(f"train.fsdp_units names {missing}, but no module of the model is of that class; its "
                          f"module classes are {present}: name the blocks among them (recipe.fsdp_units), or "
                          "leave it None for the default units")
    shared = [type(m).__name__ for m in units if not _self_contained(model, m)]
    if shared:
        raise ConfigError(f"train.fsdp_units: {shared[0]} shares parameters with modules outside it (tied weights), "
                          "so it cannot be an FSDP unit of its own; name a class that holds all of its parameters")
    return units


def _by_size(model: nn.Module, max_params: int | None) -> list[nn.Module]:
    total = _count(model)
    limit = max_params if max_params else max(1 << 20, total // 16)  # small models: one unit, the root
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> bool:
        """Units among ``module``'s children (and below); True when it found any."""
        found = False
        for child in module.children():
            n = _count(child)
            if not n:
                continue
            splittable = isinstance(child, _CONTAINERS) or (n > limit and any(_count(c) for c in child.children()))
            if splittable and visit(child):
                found = True
            elif not isinstance(child, _CONTAINERS) and n >= limit // 4 and _self_contained(model, child):
                units.append(child)  # a block's worth, or one that would not split into units
                found = True
        return found

    visit(model)
    return units


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _self_contained(root: nn.Module, module: nn.Module) -> bool:
    """No parameter of ``module`` is also held by a module outside it."""
    inside = {id(m) for m in module.modules()}
    mine = {id(p) for p in module.parameters()}
    return not any(id(p) in mine for m in root.modules() if id(m) not in inside
                   for p in m.parameters(recurse=False))


def _post_order(module: nn.Module) -> list[nn.Module]:
    out: list[nn.Module] = []
    for child in module.children():
        out += _post_order(child)
    out.append(module)
    return out


def check_unit_names(build, names: Sequence[str]) -> None:
    """Raise ConfigError when ``names`` name no class of the model ``build()`` makes, before any
    data is read or memory taken: the model is built on the meta device (no storage, no
    initialisation). A factory that cannot build there (one that reads weights from a file, say)
    is checked when the real model is wrapped instead, by the same ``fsdp_units``."""
    if not names:
        return
    import torch

    try:
        with torch.device("meta"):
            model = build()
    except Exception as e:  # not an error of the run: the real build, moments later, checks the names
        log.info("fsdp_units are checked once the model is built: it does not build on the meta device (%s)", e)
        return
    fsdp_units(model, names)
