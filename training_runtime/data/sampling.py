"""Which samples each rank reads, in which order, cut into sorted batches.

Two orders (``data.sample_order``):

- ``partitioned`` (the default): the epoch's order comes from the seed, the epoch and the shards
  alone, and ranks take their part of it, so a run resumed at another world size continues the
  same order (``rank_epoch_indices``). Each rank reads a few contiguous runs of the epoch's
  shuffled shards, not every shard (``shard_schedule`` lists them, for a streaming cache).
- ``global``: ``torch.utils.data.DistributedSampler``'s order (``epoch_indices``): an epoch
  permutation over all samples, strided by rank. It depends on the world size and every batch
  touches every shard. Runs trained before ``data.partitions`` existed used it; it is kept so that
  their versions reproduce and their checkpoints resume.

The partitioned order, step by step (docs/datasets-beyond-one-node.md says why):

1. ``epoch_order``: the split's shards permuted by ``[seed, epoch]``; the samples of each block of
   ``shuffle_block`` consecutive shards in that order shuffled among themselves. N samples.
2. That order cut into P (``data.partitions``) contiguous spans, the first ``N mod P`` one sample
   longer than the rest.
3. Global position g takes span ``g mod P``'s sample number ``g div P``: the spans interleaved.
   With the longer spans first, positions 0..N-1 are exactly the epoch, with no gap.
4. Global step s takes positions ``[s*B, (s+1)*B)`` (B the global batch); rank r of W takes those
   with ``g mod W == r``. W divides P, so rank r reads only spans ``p mod W == r``, and which
   samples a step holds does not depend on W.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SAMPLE_ORDERS = ("partitioned", "global")


# ---------------------------------------------------------------- the partitioned order
def epoch_order(shard_sizes: Sequence[int], seed: int, epoch: int, shuffle_block: int) -> np.ndarray:
    """The epoch's order of all samples (global indices, shard by shard as the manifest lists
    them): the shards permuted by ``[seed, epoch]``, then the samples of each run of
    ``shuffle_block`` consecutive shards of that permutation shuffled among themselves. It
    depends on nothing else: not the world size, not ``data.partitions``."""
    sizes = _sizes(shard_sizes)
    if shuffle_block < 1:
        raise ValueError(f"shuffle_block must be >= 1, got {shuffle_block}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rng = np.random.default_rng([seed, epoch])
    shards = rng.permutation(len(sizes))
    lengths = sizes[shards]
    # every sample in permuted-shard order: its shard's start plus its offset in the shard
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    samples = np.repeat(starts[shards], lengths) + (np.arange(len(first)) - first)
    # shuffled within blocks: sort by (block, random key); one sort for all blocks
    block = np.repeat(np.arange(len(shards)) // shuffle_block, lengths)
    return samples[np.lexsort((rng.random(len(samples)), block))]


def span_starts(num_samples: int, partitions: int) -> np.ndarray:
    """The P+1 boundaries of the P spans of an epoch of ``num_samples``: the first
    ``num_samples mod P`` spans hold ``ceil(N/P)`` samples, the others ``floor(N/P)``."""
    if not 1 <= partitions <= num_samples:
        raise ValueError(f"partitions must be between 1 and the {num_samples} samples, got {partitions}")
    q, rem = divmod(num_samples, partitions)
    lengths = np.full(partitions, q, dtype=np.int64)
    lengths[:rem] += 1
    return np.concatenate([[0], np.cumsum(lengths)])


def epoch_positions(num_samples: int, partitions: int, global_batch: int) -> int:
    """Global positions an epoch hands out: N, plus the last step's padding up to a multiple of
    ``gcd(B, P)`` (fewer than that many; zero when it divides N). Every world size a run can
    have divides both B and P, hence that multiple: the padding does not depend on the world
    size, and every rank gets the same number of samples."""
    unit = math.gcd(global_batch, partitions)
    return -(-num_samples // unit) * unit


def rank_epoch_indices(shard_sizes: Sequence[int], seed: int, epoch: int, partitions: int, world_size: int,
                       rank: int, global_batch: int, shuffle_block: int) -> np.ndarray:
    """Rank ``rank`` of ``world_size``'s sample indices for one epoch, in order: its
    ``global_batch // world_size`` samples of each global step, step after step (see the module
    docstring). ``world_size`` must divide ``partitions`` and ``global_batch``.

    Padding: when N is not a multiple of ``gcd(global_batch, partitions)`` the last global step is
    filled up to one with repeated samples: padded position g (g >= N) takes the last sample of
    span ``g mod P``, one of this rank's own spans. So at most ``gcd(B, P) - 1`` samples an epoch
    are seen twice, distinct ones, the same whatever the world size (DistributedSampler pads too,
    up to W-1). All ranks get the same number of samples, so they run the same number of steps."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    if partitions % world_size or global_batch % world_size:
        raise ValueError(f"world_size {world_size} must divide partitions ({partitions}) and the global "
                         f"batch ({global_batch})")
    order = epoch_order(shard_sizes, seed, epoch, shuffle_block)
    n = len(order)
    bounds = span_starts(n, partitions)
    g = np.arange(rank, epoch_positions(n, partitions, global_batch), world_size)
    span = g % partitions
    offset = np.where(g < n, g // partitions, bounds[span + 1] - bounds[span] - 1)  # padding: the span's last
    return order[bounds[span] + offset]


def steps_per_epoch(num_samples: int, global_batch: int) -> int:
    """Global steps an epoch takes: ``ceil(N / B)``, for either order and any world size (the
    global order's padding to a multiple of the world size never adds a step, since the world
    size divides B)."""
    return -(-num_samples // global_batch)


class ShardUse(NamedTuple):
    shard: int  # index into the split's shards, as the manifest lists them
    first: int  # the first batch (or position) that reads it
    last: int  # the last batch (or position) that reads it: after it, the shard may be evicted


def shard_schedule(indices: np.ndarray, shard_sizes: Sequence[int], batch_size: int = 1) -> list[ShardUse]:
    """The shards a rank reads for ``indices`` (its epoch, as ``rank_epoch_indices`` gives it), in
    the order it first reads them: one ``ShardUse(shard, first, last)`` per shard read at all.
    ``first`` and ``last`` count batches of ``batch_size`` (the rank's local batch; 1: positions
    in ``indices``). Ties on ``first`` are in shard order, the order a sorted batch reads them.

    The contract a streaming cache relies on: fetching shards in this list's order fetches each
    one before its first batch; a shard is not read again after batch ``last`` in this epoch, so it
    can be evicted then; at batch b the shards in use are those with ``first <= b <= last``.
    Under the partitioned order that working set stays small: about ``shuffle_block`` shards for
    each of the rank's ``P / W`` spans, plus a shard at a span's boundary."""
    sizes = _sizes(shard_sizes)
    idx = np.asarray(indices, dtype=np.int64)
    if len(idx) == 0:
        return []
    if idx.min() < 0 or idx.max() >= sizes.sum():
        raise ValueError(f"indices outside the split's {int(sizes.sum())} samples")
    shard = np.searchsorted(np.cumsum(sizes), idx, side="right")
    used, first = np.unique(shard, return_index=True)
    _, from_end = np.unique(shard[::-1], return_index=True)
    last = len(idx) - 1 - from_end
    rows = sorted(zip((first // batch_size).tolist(), used.tolist(), (last // batch_size).tolist()))
    return [ShardUse(s, f, lst) for f, s, lst in rows]


def _sizes(shard_sizes: Sequence[int]) -> np.ndarray:
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if sizes.ndim != 1 or len(sizes) == 0 or (sizes < 1).any():
        raise ValueError(f"shard sizes must be a non-empty list of positive counts, got {list(shard_sizes)!r}")
    return sizes


# ---------------------------------------------------------------- the global order
def epoch_indices(num_samples: int, world_size: int, rank: int, epoch: int, seed: int,
                  shuffle: bool = True) -> np.ndarray:
    """This rank's sample indices for one epoch in the ``global`` order, like
    ``torch.utils.data.DistributedSampler`` (drop_last=False): an epoch-seeded permutation padded
    by wrapping around to a multiple of ``world_size``, then taken with stride ``world_size`` from
    ``rank``. Every sample appears at least once per epoch across ranks and all ranks get the same
    count. The order depends on the world size (see the module docstring)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(num_samples)
    else:
        order = np.arange(num_samples)
    total = math.ceil(num_samples / world_size) * world_size
    pad = total - num_samples
    if pad:
        order = np.concatenate([order, np.resize(order, pad)])
    return order[rank:total:world_size]


# ---------------------------------------------------------------- batches
def sorted_batches(indices: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """``indices`` cut into batches, each in index order (the loss is a mean, so order within a
    batch does not matter) so that gathering reads each shard front to back. One sort for all full
    batches: a sort call per batch cost more than the sorting when batches are small."""
    full = len(indices) // batch_size * batch_size
    batches = list(np.sort(indices[:full].reshape(-1, batch_size), axis=1))
    if full < len(indices):
        batches.append(np.sort(indices[full:]))
    return batches
