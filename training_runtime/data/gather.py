"""Gathering a batch's rows from memory-mapped shards: where each sample lies (a plan, made once per
batch and used for every column) and the copy into one contiguous output."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------- row gathering (v1 and v2 shards)
# Large samples copy faster from the memory map with an advanced index into the slice
# (benchmarks/: 192 KB samples 0.27x -> 0.43x and 0.32x -> 0.40x of the memory-read limit in two
# side-by-side runs); 4 KB samples are fastest with np.take into ``out``.
LARGE_SAMPLE_BYTES = 64 * 1024


@dataclass(frozen=True)
class RowPlan:
    """Where a batch's samples lie in a split's shards, worked out once per batch and used for
    every column gathered: each segment ``(s, a, e)`` says that rows ``a:e`` of the output are
    rows ``local[a:e]`` of shard ``s``; ``order`` (None when the rows came sorted, or sorted
    batch by batch) puts them back in the order asked for."""

    segments: list[tuple[int, int, int]]
    local: np.ndarray
    order: np.ndarray | None


def plan_rows(starts: np.ndarray, idx: np.ndarray) -> RowPlan:
    """``starts``: each shard's first global sample index, then the total. Raises IndexError for
    an index outside the split."""
    if len(idx) and np.all(idx[1:] >= idx[:-1]):
        return plan_batches(starts, [idx])
    num_samples = int(starts[-1])
    if len(idx) and (idx.min() < 0 or idx.max() >= num_samples):
        raise IndexError(f"sample index out of range [0, {num_samples})")
    order = np.argsort(idx, kind="stable")
    plan = plan_batches(starts, [idx[order]])
    return RowPlan(plan.segments, plan.local, order)


def plan_batches(starts: np.ndarray, batches: list[np.ndarray]) -> RowPlan:
    """The plan of several batches gathered as one (their rows one batch after the other), each
    batch's indices sorted. A batch touches most shards, so the Python work per shard is kept to
    one take per segment: shard offsets are computed for all the rows at once."""
    num_samples = int(starts[-1])
    for b in batches:
        if len(b) and (b[0] < 0 or b[-1] >= num_samples):
            raise IndexError(f"sample index out of range [0, {num_samples})")
    if len(batches) == 1:
        idx = keys = batches[0]
        edges = starts
    else:
        # Batch k's indices shifted by k * num_samples make the rows one sorted run, so one
        # searchsorted finds every (batch, shard) boundary.
        idx = np.concatenate(batches)
        run = np.repeat(np.arange(len(batches), dtype=np.int64), [len(b) for b in batches])
        keys = idx + run * num_samples
        edges = (starts[None, :] + np.arange(len(batches), dtype=np.int64)[:, None] * num_samples).ravel()
    bounds = np.searchsorted(keys, edges).reshape(len(batches), -1)
    counts = np.diff(bounds, axis=1).ravel()
    local = idx - np.repeat(np.tile(starts[:-1], len(batches)), counts)
    used = np.flatnonzero(counts)
    segments = list(zip((used % (len(starts) - 1)).tolist(), bounds[:, :-1].ravel()[used].tolist(),
                        bounds[:, 1:].ravel()[used].tolist()))
    return RowPlan(segments, local, None)


def take_rows(arrays: list[np.ndarray], plan: RowPlan, out: np.ndarray) -> None:
    """Copy the planned rows of one column (one array per shard, samples on axis 0) into ``out``.
    The arrays should be plain ndarray views of the memory maps: np.memmap's subclass hooks cost
    on every call."""
    if plan.order is None:
        _take_segments(arrays, plan, out)
    else:
        tmp = np.empty_like(out)
        _take_segments(arrays, plan, tmp)
        out[plan.order] = tmp


def _take_segments(arrays: list[np.ndarray], plan: RowPlan, out: np.ndarray) -> None:
    large = out[0].nbytes >= LARGE_SAMPLE_BYTES if len(out) else False
    local = plan.local
    for s, a, e in plan.segments:
        if large:
            out[a:e] = arrays[s][local[a:e]]
        else:
            # mode="clip": the default "raise" buffers ``out``, a hidden second copy
            np.take(arrays[s], local[a:e], axis=0, out=out[a:e], mode="clip")
