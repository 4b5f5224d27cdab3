"""Gathering a batch's rows from memory-mapped shards: where each sample lies (a plan, made once per
load and used for every column) and the copy into one contiguous output."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

# ---------------------------------------------------------------- row gathering
# Which copy is fastest depends on the row size (measured on the 2-core benchmark machine, one
# thread, random sorted rows of a page-cache shard): up to 96 KB ``ndarray.take`` and
# ``torch.index_select`` move the same ~8 GB/s (and take costs less per call: 516-byte token rows
# 27 against 40 us a batch); at 192 KB take falls to 6.9 GB/s, where glibc's memmove (numpy's copy,
# also ctypes.memmove) is slow, while index_select's own copy loop keeps 15.8 GB/s.
LARGE_SAMPLE_BYTES = 64 * 1024
_READ_ONLY_WARNING = "The given NumPy array is not writable"


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
    if len(batches) == 1:  # the common case, in half the numpy calls
        idx = batches[0]
        bounds = np.searchsorted(idx, starts)
        counts = np.diff(bounds)
        used = np.flatnonzero(counts)
        local = idx - np.repeat(starts[:-1], counts)
        return RowPlan(list(zip(used.tolist(), bounds[used].tolist(), bounds[used + 1].tolist())), local, None)
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


class ColumnRows:
    """One fixed-shape column of a split: one array per shard (samples on axis 0), plain ndarray
    views of the memory maps (np.memmap's subclass hooks cost on every call). Columns of large
    samples also keep a tensor view of each shard for ``torch.index_select``, which copies with
    torch's intra-op threads (``torch.get_num_threads()``; the launcher sets OMP_NUM_THREADS per
    rank). Both copies release the GIL, so the loader's threads gather side by side.

    A streamed split opens its shards as they are read: a shard not open is None (``put`` and
    ``drop`` it as the split maps and unmaps it); ``take`` reads only open shards."""

    def __init__(self, arrays: list[np.ndarray | None], sample_bytes: int | None = None):
        self.arrays = list(arrays)
        if sample_bytes is None:
            first = next((a for a in self.arrays if a is not None), None)
            sample_bytes = int(np.prod(first.shape[1:])) * first.itemsize if first is not None else 0
        self.sample_bytes = sample_bytes
        large = self.sample_bytes >= LARGE_SAMPLE_BYTES
        self.tensors = ([None if a is None else t for a, t in zip(self.arrays, _read_only_tensors(
            [a if a is not None else np.zeros(0, np.uint8) for a in self.arrays]))] if large else None)

    def put(self, s: int, array: np.ndarray) -> None:
        """Shard ``s`` is open: ``array`` is its view."""
        self.arrays[s] = array
        if self.tensors is not None:
            self.tensors[s] = _read_only_tensors([array])[0]

    def drop(self, s: int) -> None:
        """Shard ``s`` is closed: its views go, so its memory map can be unmapped."""
        self.arrays[s] = None
        if self.tensors is not None:
            self.tensors[s] = None

    def take(self, plan: RowPlan, out: np.ndarray) -> None:
        """Copy the planned rows into ``out`` (contiguous, the column's dtype and sample shape)."""
        if plan.order is None:
            self._take_segments(plan, out)
        else:
            tmp = np.empty_like(out)
            self._take_segments(plan, tmp)
            out[plan.order] = tmp

    def _take_segments(self, plan: RowPlan, out: np.ndarray) -> None:
        local = plan.local
        if self.tensors is not None and len(out):
            dest, rows = torch.from_numpy(out), torch.from_numpy(local)
            for s, a, e in plan.segments:
                torch.index_select(self.tensors[s], 0, rows[a:e], out=dest[a:e])
            return
        for s, a, e in plan.segments:
            # mode="clip": the default "raise" buffers ``out``, a hidden second copy
            self.arrays[s].take(local[a:e], axis=0, out=out[a:e], mode="clip")


def _read_only_tensors(arrays: list[np.ndarray]) -> list[torch.Tensor]:
    """Tensor views of read-only memory maps. torch warns (once per process) that it cannot mark
    a tensor read-only; these are only ever the source of a copy, so that one warning is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_READ_ONLY_WARNING, category=UserWarning)
        return [torch.from_numpy(a) for a in arrays]
