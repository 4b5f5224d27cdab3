"""Pure history and tree algorithms: merge base, three-way tree merge, tree diff.

Trees are ``{path: entry}`` mappings where equal entries mean equal content; no I/O here, so
the rules are easy to test on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

Entry = TypeVar("Entry", bound=Hashable)


def ancestors(start: str, parents_of: Callable[[str], tuple[str, ...]]) -> set[str]:
    """All commits reachable from ``start``, including itself."""
    seen = {start}
    stack = [start]
    while stack:
        for parent in parents_of(stack.pop()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def merge_base(
    left: str, right: str, parents_of: Callable[[str], tuple[str, ...]],
    generation_of: Callable[[str], int],
) -> str | None:
    """The best common ancestor: one that no other common ancestor descends from.

    With criss-cross histories several qualify; the one with the highest generation (longest
    path from the root) is chosen, deterministically broken by id.
    """
    common = ancestors(left, parents_of) & ancestors(right, parents_of)
    if not common:
        return None
    # A common ancestor that is a proper ancestor of another common ancestor is not "best".
    dominated: set[str] = set()
    for c in common:
        dominated |= ancestors(c, parents_of) - {c}
    best = common - dominated
    return max(best, key=lambda c: (generation_of(c), c))


def merge_trees(
    base: Mapping[str, Entry], ours: Mapping[str, Entry], theirs: Mapping[str, Entry],
) -> tuple[dict[str, Entry], list[str]]:
    """Three-way merge by path. Returns (merged tree, sorted conflicting paths).

    A path changed on only one side takes that side; changed identically on both sides is
    fine; changed differently on both sides (including change vs delete) conflicts.
    """
    merged: dict[str, Entry] = {}
    conflicts: list[str] = []
    for path in sorted(set(base) | set(ours) | set(theirs)):
        b, o, t = base.get(path), ours.get(path), theirs.get(path)
        if o == t:
            result = o
        elif o == b:
            result = t
        elif t == b:
            result = o
        else:
            conflicts.append(path)
            continue
        if result is not None:
            merged[path] = result
    return merged, conflicts


def diff_trees(
    left: Mapping[str, Entry], right: Mapping[str, Entry], prefix: str = "",
) -> list[tuple[str, str]]:
    """(path, "added" | "removed" | "changed") going from ``left`` to ``right``, by path."""
    changes = []
    for path in sorted(set(left) | set(right)):
        if not path.startswith(prefix):
            continue
        if path not in left:
            changes.append((path, "added"))
        elif path not in right:
            changes.append((path, "removed"))
        elif left[path] != right[path]:
            changes.append((path, "changed"))
    return changes
