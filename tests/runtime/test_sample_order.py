"""The partitioned sample order (data/sampling.py): an epoch's order that does not depend on the
world size, ranks that read their own spans, and resumes at another world size that continue it."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_runtime.data.sampling import (
    epoch_order,
    epoch_positions,
    rank_epoch_indices,
    shard_schedule,
    span_starts,
    steps_per_epoch,
)


@st.composite
def runs(draw):
    """Shard sizes, P, a global batch B and the world sizes a run of them can have (W | P, W | B)."""
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=12))
    n = sum(sizes)
    partitions = draw(st.sampled_from([p for p in (1, 2, 3, 4, 6, 8, 12) if p <= n]))
    world = draw(st.sampled_from([w for w in (1, 2, 3, 4, 6, 12) if partitions % w == 0]))
    batch = world * draw(st.integers(1, 8))
    worlds = [w for w in range(1, partitions + 1) if partitions % w == 0 and batch % w == 0]
    return sizes, partitions, batch, worlds, draw(st.integers(0, 2**31)), draw(st.integers(0, 5)), \
        draw(st.integers(1, 5))


def _ranks(sizes, seed, epoch, partitions, world, batch, block):
    return [rank_epoch_indices(sizes, seed, epoch, partitions, world, r, batch, block) for r in range(world)]


def _steps(parts, world, batch, n):
    """The multiset of samples of each global step, from every rank's local batches."""
    local = batch // world
    return [Counter(np.concatenate([p[s * local:(s + 1) * local] for p in parts]).tolist())
            for s in range(steps_per_epoch(n, batch))]


def _span_of(sizes, seed, epoch, partitions, block):
    """sample -> the span of the epoch's order it lies in."""
    order = epoch_order(sizes, seed, epoch, block)
    bounds = span_starts(len(order), partitions)
    span = np.searchsorted(bounds, np.arange(len(order)), side="right") - 1
    return dict(zip(order.tolist(), span.tolist()))


@settings(max_examples=150, deadline=None)
@given(runs())
def test_an_epoch_is_every_sample_once_plus_the_stated_padding(run):
    sizes, partitions, batch, worlds, seed, epoch, block = run
    n = sum(sizes)
    unit = math.gcd(batch, partitions)
    for world in worlds:
        parts = _ranks(sizes, seed, epoch, partitions, world, batch, block)
        assert len({len(p) for p in parts}) == 1  # all ranks run the same number of steps
        assert math.ceil(len(parts[0]) / (batch // world)) == steps_per_epoch(n, batch)
        seen = Counter(np.concatenate(parts).tolist())
        assert set(seen) == set(range(n))
        repeats = sum(seen.values()) - n
        assert repeats == epoch_positions(n, partitions, batch) - n == (-n) % unit < unit
        assert max(seen.values()) <= 2  # padding repeats distinct samples


@settings(max_examples=150, deadline=None)
@given(runs())
def test_each_global_step_holds_the_same_samples_for_every_world_size(run):
    sizes, partitions, batch, worlds, seed, epoch, block = run
    n = sum(sizes)
    by_world = [_steps(_ranks(sizes, seed, epoch, partitions, w, batch, block), w, batch, n) for w in worlds]
    assert all(steps == by_world[0] for steps in by_world)
    # ... and each step is its B positions of the interleaved spans (the last one padded)
    assert [sum(s.values()) for s in by_world[0][:-1]] == [batch] * (len(by_world[0]) - 1)


@settings(max_examples=150, deadline=None)
@given(runs())
def test_ranks_are_disjoint_within_a_step_and_read_only_their_own_spans(run):
    sizes, partitions, batch, worlds, seed, epoch, block = run
    n = sum(sizes)
    span = _span_of(sizes, seed, epoch, partitions, block)
    for world in worlds:
        parts = _ranks(sizes, seed, epoch, partitions, world, batch, block)
        local = batch // world
        for r, p in enumerate(parts):
            assert {span[i] % world for i in p.tolist()} <= {r}  # padding included
        for s in range(steps_per_epoch(n, batch)):
            rows = [set(p[s * local:(s + 1) * local].tolist()) for p in parts]
            assert sum(map(len, rows)) == len(set().union(*rows))


@settings(max_examples=100, deadline=None)
@given(runs())
def test_a_resume_at_another_world_size_continues_with_exactly_the_remaining_samples(run):
    sizes, partitions, batch, worlds, seed, epoch, block = run
    n = sum(sizes)
    steps = steps_per_epoch(n, batch)
    whole = Counter(np.concatenate(_ranks(sizes, seed, epoch, partitions, worlds[0], batch, block)).tolist())
    for before in worlds:
        for after in worlds:
            for stop in {0, steps // 2, steps - 1, steps}:
                first = [p[:stop * (batch // before)] for p in _ranks(sizes, seed, epoch, partitions, before,
                                                                       batch, block)]
                rest = [p[stop * (batch // after):] for p in _ranks(sizes, seed, epoch, partitions, after,
                                                                     batch, block)]
                assert Counter(np.concatenate(first + rest).tolist()) == whole


def test_the_order_depends_on_seed_epoch_and_partitions_alone():
    sizes = [50, 50, 30, 70, 10, 40]
    a = rank_epoch_indices(sizes, 3, 1, 4, 2, 0, 8, 2)
    assert np.array_equal(a, rank_epoch_indices(sizes, 3, 1, 4, 2, 0, 8, 2))
    for other in ((4, 1, 4), (3, 2, 4), (3, 1, 2)):  # seed, epoch, partitions
        seed, epoch, partitions = other
        assert not np.array_equal(a, rank_epoch_indices(sizes, seed, epoch, partitions, 2, 0, 8, 2)), other
    # the epoch's order itself takes neither the world size nor P
    order = epoch_order(sizes, 3, 1, 2)
    assert sorted(order.tolist()) == list(range(sum(sizes)))
    assert not np.array_equal(order, epoch_order(sizes, 3, 2, 2))


def test_shards_are_shuffled_in_blocks_of_shuffle_block():
    """Each run of shuffle_block shards of the epoch's shard permutation is one contiguous stretch
    of the order: a rank reading its spans holds about that many shards at a time."""
    sizes = [10] * 12
    shard = lambda i: i // 10  # noqa: E731
    for block in (1, 3, 4):
        order = epoch_order(sizes, 0, 0, block).tolist()
        stretches = [order[i:i + 10 * block] for i in range(0, len(order), 10 * block)]
        groups = [{shard(i) for i in s} for s in stretches]
        assert all(len(g) == block for g in groups[:-1]) and len(set().union(*groups)) == 12
        assert all(a.isdisjoint(b) for k, a in enumerate(groups) for b in groups[k + 1:])


def test_spans_are_longer_first_and_interleave_without_gaps():
    assert span_starts(10, 4).tolist() == [0, 3, 6, 8, 10]
    assert span_starts(8, 4).tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="partitions must be between 1 and the 3 samples"):
        span_starts(3, 4)
    # one rank, P=4, no padding: positions 0..9 take span p=g%4's sample g//4
    order = epoch_order([10], 5, 0, 1)
    got = rank_epoch_indices([10], 5, 0, 4, 1, 0, 2, 1)
    assert got.tolist() == [order[[0, 3, 6, 8][g % 4] + g // 4] for g in range(10)]


def test_padding_takes_the_last_sample_of_the_ranks_own_span():
    sizes = [7]  # N=7, P=4, B=4: the last step has 3 positions, padded to 4 (gcd(4, 4))
    order = epoch_order(sizes, 0, 0, 1)
    bounds = span_starts(7, 4)  # spans of 2, 2, 2, 1
    for world in (1, 2, 4):
        parts = _ranks(sizes, 0, 0, 4, world, 4, 1)
        flat = sorted(np.concatenate(parts).tolist())
        assert len(flat) == 8
        # position 7 is span 3's: its last (only) sample, read by rank 7 % world
        pad = order[bounds[4] - 1]
        assert flat.count(pad) == 2 and parts[7 % world][-1] == pad


def test_a_world_size_that_does_not_divide_partitions_is_refused():
    with pytest.raises(ValueError, match=r"world_size 4 must divide partitions \(6\)"):
        rank_epoch_indices([20], 0, 0, 6, 4, 0, 8, 1)
    with pytest.raises(ValueError, match="rank 2 outside world_size 2"):
        rank_epoch_indices([20], 0, 0, 4, 2, 2, 8, 1)
    with pytest.raises(ValueError, match="shuffle_block must be >= 1"):
        epoch_order([20], 0, 0, 0)
    with pytest.raises(ValueError, match="shard sizes must be a non-empty list of positive counts"):
        epoch_order([20, 0], 0, 0, 1)


def test_shard_schedule_lists_each_shard_at_its_first_and_last_batch():
    sizes = [4, 4, 4]  # samples 0-3, 4-7, 8-11
    idx = np.array([5, 0, 1, 6, 9, 2, 4, 10])
    assert shard_schedule(idx, sizes) == [(1, 0, 6), (0, 1, 5), (2, 4, 7)]  # by first use
    # batches of 2: [5,0] [1,6] [9,2] [4,10]; a tie on the first batch goes in shard order
    assert shard_schedule(idx, sizes, 2) == [(0, 0, 2), (1, 0, 3), (2, 2, 3)]
    assert shard_schedule(np.array([], dtype=np.int64), sizes) == []
    with pytest.raises(ValueError, match="indices outside the split's 12 samples"):
        shard_schedule(np.array([12]), sizes)


@settings(max_examples=100, deadline=None)
@given(runs())
def test_the_shard_schedule_is_the_shards_a_rank_reads_and_when(run):
    sizes, partitions, batch, worlds, seed, epoch, block = run
    starts = np.concatenate([[0], np.cumsum(sizes)])
    world = worlds[-1]
    local = batch // world
    for r, idx in enumerate(_ranks(sizes, seed, epoch, partitions, world, batch, block)):
        schedule = shard_schedule(idx, sizes, local)
        shard_of = np.searchsorted(starts, idx, side="right") - 1
        assert sorted(s.shard for s in schedule) == sorted(set(shard_of.tolist()))
        assert [(s.first, s.shard) for s in schedule] == sorted((s.first, s.shard) for s in schedule)
        for s in schedule:
            batches = np.flatnonzero(shard_of == s.shard) // local
            assert (s.first, s.last) == (batches.min(), batches.max())


def test_a_rank_reads_a_few_contiguous_runs_of_the_shuffled_shards():
    """What the streaming cache relies on: 64 shards of 100, P=8, W=4: each rank reads its two
    spans, so about a quarter of the shards (plus span boundaries), and holds few at once."""
    sizes, partitions, world, batch, block = [100] * 64, 8, 4, 32, 4
    read = []
    for r in range(world):
        idx = rank_epoch_indices(sizes, 1, 0, partitions, world, r, batch, block)
        schedule = shard_schedule(idx, sizes, batch // world)
        read.append({s.shard for s in schedule})
        assert len(read[-1]) <= 64 // world + 2 * (partitions // world)
        in_use = max(sum(s.first <= b <= s.last for s in schedule) for b in range(steps_per_epoch(6400, batch)))
        assert in_use <= 2 * block * (partitions // world) + 2
    assert sum(map(len, read)) <= 64 + partitions  # boundary shards: shared by two spans at most


# ---------------------------------------------------------------- the settings
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.runtime.helpers import make_config, make_dataset

    root = tmp_path_factory.mktemp("order_cfg")
    manifest, locations = make_dataset(root, n_train=40, n_test=8, per_shard=16)
    return make_config(root, manifest, locations, batch_size=24)


def _with(base, **data):
    import copy

    d = copy.deepcopy(base)
    d["data"].update(data)
    return d


def test_the_defaults_are_the_partitioned_order_on_the_first_launchs_world_size(base):
    from training_runtime.config import RunConfig

    cfg = RunConfig.from_dict(base)
    assert (cfg.data.sample_order, cfg.data.partitions, cfg.data.shuffle_block) == ("partitioned", 0, 4)
    for world in (1, 2, 3, 4, 8):  # with P=0 any world size is its own first launch
        cfg.validate_world_size(world)


def test_a_world_size_that_does_not_divide_data_partitions_is_refused_with_the_sizes_that_fit(base):
    from training_runtime.config import ConfigError, RunConfig

    cfg = RunConfig.from_dict(_with(base, partitions=6))
    for world in (1, 2, 3, 6):
        cfg.validate_world_size(world)
    with pytest.raises(ConfigError) as e:
        cfg.validate_world_size(4)
    assert ("world size 4 does not divide data.partitions=6, the canonical partitions of this run's sample "
            "order: run it on [1, 2, 3, 6] ranks") in str(e.value)
    assert "data.partitions=12" in str(e.value)
    # the global order has no partitions to divide
    RunConfig.from_dict(_with(base, partitions=6, sample_order="global")).validate_world_size(4)


@pytest.mark.parametrize("data, message", [
    ({"partitions": -1}, "data.partitions must be between 0 (the first launch's world size) and the 40 training "
                         "samples, got -1"),
    ({"partitions": 41}, "and the 40 training samples, got 41"),
    ({"shuffle_block": 0}, "data.shuffle_block must be >= 1 shard, got 0"),
    ({"sample_order": "random"}, "data.sample_order must be one of ['partitioned', 'global'], got 'random'"),
])
def test_bad_order_settings_are_refused(base, data, message):
    from training_runtime.config import ConfigError, RunConfig

    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(_with(base, **data))
    assert message in str(e.value)
