"""Which samples each rank reads, in which order: DistributedSampler semantics (an epoch-seeded
permutation padded to a multiple of the world size, strided by rank) cut into sorted batches."""

from __future__ import annotations

import math

import numpy as np


# ---------------------------------------------------------------- sampler math
def epoch_indices(num_samples: int, world_size: int, rank: int, epoch: int, seed: int,
                  shuffle: bool = True) -> np.ndarray:
    """This rank's sample indices for one epoch, like ``torch.utils.data.DistributedSampler``
    (drop_last=False): an epoch-seeded permutation padded by wrapping around to a multiple of
    ``world_size``, then taken with stride ``world_size`` from ``rank``. Every sample appears at
    least once per epoch across ranks and all ranks get the same count."""
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


def steps_per_epoch(num_samples: int, world_size: int, global_batch: int) -> int:
    per_rank = math.ceil(num_samples / world_size)
    return math.ceil(per_rank / (global_batch // world_size))


def sorted_batches(indices: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """``indices`` cut into batches, each in index order (the loss is a mean, so order within a
    batch does not matter) so that gathering reads each shard front to back. One sort for all full
    batches: a sort call per batch cost more than the sorting when batches are small."""
    full = len(indices) // batch_size * batch_size
    batches = list(np.sort(indices[:full].reshape(-1, batch_size), axis=1))
    if full < len(indices):
        batches.append(np.sort(indices[full:]))
    return batches
