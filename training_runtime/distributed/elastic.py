"""Elastic gangs: the sizes a gang of ``min_nodes..max_nodes`` nodes can have, the canonical
partitions that every one of them divides, and the resizes a training went through.

A gang re-forms through torchrun's c10d rendezvous (``--nnodes=MIN:MAX``): when a node is lost,
the workers that are left fail their next collective, their agents restart them and the
rendezvous closes with the nodes that are left; when a node comes back, the running agents see it
waiting and restart their workers (SIGTERM: they checkpoint first) so that it joins. Each new
group resumes from the last checkpoint. What keeps a resize from changing the training:

- ``train.batch_size`` is the global batch (summed over ranks and accumulation steps), so every
  size takes the same optimizer steps over the same samples; the per-rank batch changes;
- the sample order is the world-size-independent one (``data.partitions``): an elastic launch sets
  the partitions to the least common multiple of its world sizes, so every size holds whole
  partitions and a resumed epoch continues the same order, no sample repeated or skipped.

Stdlib only: core/spec.py checks a recipe with it when definitions load, without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

ELASTIC_ENV = "PLATFORM_ELASTIC"  # "MIN:MAX" nodes, set by the launchers for an elastic gang's workers


def world_sizes(min_nodes: int, max_nodes: int, per_node: int) -> list[int]:
    """Every world size a gang of ``min_nodes..max_nodes`` nodes of ``per_node`` ranks can have."""
    if not 1 <= min_nodes <= max_nodes or per_node < 1:
        raise ValueError(f"need 1 <= min_nodes ({min_nodes}) <= max_nodes ({max_nodes}) and per_node ({per_node}) >= 1")
    return [n * per_node for n in range(min_nodes, max_nodes + 1)]


def elastic_partitions(min_nodes: int, max_nodes: int, per_node: int) -> int:
    """The canonical partitions of an elastic gang's sample order: the least common multiple of its
    world sizes, so that each of them holds whole partitions."""
    return math.lcm(*world_sizes(min_nodes, max_nodes, per_node))


def parse_elastic(value: str | None) -> tuple[int, int] | None:
    """``PLATFORM_ELASTIC``'s ``MIN:MAX`` as (min, max); None when unset or empty."""
    if not value:
        return None
    low, _, high = value.partition(":")
    return int(low), int(high or low)


def resizes(attempts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The resizes between consecutive attempts (dicts with ``world_size``, ``started_at``,
    ``resumed_from_step``, ``name``, in the order they ran): when, from what size to what, and why."""
    out: list[dict[str, Any]] = []
    previous = None
    for a in attempts:
        size = a.get("world_size")
        if previous is not None and size is not None and previous.get("world_size") is not None \
                and size != previous["world_size"]:
            before = previous["world_size"]
            out.append({
                "at": a.get("started_at"),
                "attempt": a.get("name"),
                "from_world_size": before,
                "to_world_size": size,
                "resumed_from_step": a.get("resumed_from_step"),
                "reason": (f"a node left the gang ({before} -> {size} ranks); the rest re-formed from the last "
                           "checkpoint" if size < before else
                           f"a node joined the gang ({before} -> {size} ranks) at its next rendezvous"),
            })
        if size is not None:
            previous = a
    return out
