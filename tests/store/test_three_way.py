"""The pure merge rules, case by case."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resources.store.three_way import ancestors, diff_trees, merge_base, merge_trees


@pytest.mark.parametrize(
    ("base", "ours", "theirs", "merged", "conflicts"),
    [
        ({"a": 1}, {"a": 1}, {"a": 2}, {"a": 2}, []),          # only theirs changed
        ({"a": 1}, {"a": 3}, {"a": 1}, {"a": 3}, []),          # only ours changed
        ({"a": 1}, {"a": 2}, {"a": 2}, {"a": 2}, []),          # same change both sides
        ({"a": 1}, {"a": 2}, {"a": 3}, {}, ["a"]),             # different changes
        ({"a": 1}, {}, {"a": 1}, {}, []),                      # ours deleted
        ({"a": 1}, {}, {"a": 2}, {}, ["a"]),                   # delete vs change
        ({}, {"n": 1}, {"n": 2}, {}, ["n"]),                   # both added differently
        ({}, {"n": 1}, {"m": 2}, {"n": 1, "m": 2}, []),        # both added different paths
        ({"a": 1}, {}, {}, {}, []),                            # both deleted
    ],
)
def test_merge_trees(base, ours, theirs, merged, conflicts):
    result, found = merge_trees(base, ours, theirs)
    assert found == conflicts
    if not conflicts:
        assert result == merged


def test_merge_base_of_a_criss_cross_history_is_deterministic():
    #   r - a - c1 (merges a, b)
    #     \ b - c2 (merges b, a)
    parents = {"r": (), "a": ("r",), "b": ("r",), "c1": ("a", "b"), "c2": ("b", "a")}
    generation = {"r": 1, "a": 2, "b": 2, "c1": 3, "c2": 3}
    assert merge_base("c1", "c2", parents.__getitem__, generation.__getitem__) == "b"
    assert merge_base("a", "c1", parents.__getitem__, generation.__getitem__) == "a"
    assert merge_base("a", "b", parents.__getitem__, generation.__getitem__) == "r"
    assert ancestors("c1", parents.__getitem__) == {"c1", "a", "b", "r"}


def test_merge_base_of_unrelated_histories_is_none():
    parents = {"x": (), "y": ()}
    assert merge_base("x", "y", parents.__getitem__, lambda c: 1) is None


def test_diff_trees_by_prefix():
    assert diff_trees({"a/1": 1, "b": 2}, {"a/1": 9, "a/2": 1}, prefix="a/") == [("a/1", "changed"), ("a/2", "added")]


_trees = st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 3), max_size=6)


@given(base=_trees, ours=_trees, theirs=_trees)
def test_merge_trees_properties(base, ours, theirs):
    merged, conflicts = merge_trees(base, ours, theirs)
    # Sides are interchangeable: the same paths conflict, the same tree results.
    merged_swapped, conflicts_swapped = merge_trees(base, theirs, ours)
    assert conflicts == conflicts_swapped
    assert merged == merged_swapped
    for path in set(base) | set(ours) | set(theirs):
        b, o, t = base.get(path), ours.get(path), theirs.get(path)
        if path in conflicts:
            assert o != t and o != b and t != b
        else:
            # Every change from either side survives; an unchanged path keeps the base value.
            assert merged.get(path) == (t if o == b else o)
    # Merging with an unchanged side is the other side.
    assert merge_trees(base, base, theirs) == (dict(theirs), [])
