"""The loader: ``TypedLoader`` is the per-rank prefetching loader over a ``TypedSplit`` of either
shard format (``data.prefetch.BatchPrefetcher``: the sampler, resume and epoch chaining). It
decodes encoded columns and augments images on a thread pool, straight into the batch's (pinned)
tensors. ``TypedSplit`` and ``open_split`` are in ``training_runtime.data.split`` and importable
from here.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from training_runtime.data.augment import AugmentDraws, ImageAugment
from training_runtime.data.decode import Decoder
from training_runtime.data.device_copy import DeviceCopier
from training_runtime.data.gather import plan_batches
from training_runtime.data.prefetch import BatchPrefetcher
from training_runtime.data.shard_format import Column
from training_runtime.data.shards import DataError
from training_runtime.data.split import TypedSplit, open_split

__all__ = ["TypedLoader", "TypedSplit", "open_split"]

DEFAULT_ROLES = ("input", "target")  # what a loader yields unless told which columns
LOAD_BYTES = 1 << 20  # what one load of copy-only batches aims to move
MAX_BATCHES_PER_LOAD = 16
_TORCH_DTYPES = {np.dtype(t): torch.from_numpy(np.empty(0, t)).dtype
                 for t in ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                           "float16", "float32", "float64")}


@dataclass(frozen=True)
class _Field:
    """How one column of the split becomes one entry of the batch."""

    column: Column
    decoder: Decoder | None
    augment: ImageAugment | None
    stored_shape: tuple[int, ...]  # one sample as gathered or decoded, before augmentation
    dtype: np.dtype | None  # None: yielded as a list of bytes or str
    out_shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.column.name

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.dtype]


class _BlockPool:
    """The CPU blocks that loads fill (batch outputs, augmentation staging), shared by every loader
    of one split and handed out again once nothing refers to them.

    A load's rows are one numpy block handed over as tensors (``torch.from_numpy``); every tensor
    or numpy view cut from it keeps the block alive through its storage, so when only the pool
    still refers to a block (``sys.getrefcount``: CPython's count, which the runtime runs on),
    nothing can read it any more. Fresh memory instead costs a page fault per 4 KB on every load:
    15-20 % of the image loader's throughput on 2 cores (benchmarks/typed_loaders.py, 12.5 MB per
    batch of 128x128 images), and twice the CPU of the copy itself for 50 MB batches of 192 KB
    samples. One pool per split, not per loader: each epoch's loader (and its threads) is new, and
    a short epoch (6 batches of 192 KB samples) would otherwise fill fresh memory almost every load.
    Pinned blocks need none of this: CUDA's host allocator caches them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: list[np.ndarray] = []
        self._reserved = 0

    def reserve(self, blocks: int) -> None:
        """A loader starts that may hold ``blocks`` at once (``release`` them when it closes)."""
        with self._lock:
            self._reserved += blocks

    def release(self, blocks: int) -> None:
        """A loader closed: the pool keeps no more blocks than the loaders still open may use."""
        with self._lock:
            self._reserved -= blocks
            del self._blocks[:max(0, len(self._blocks) - self._reserved)]

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            for block in self._blocks:
                # references: the list, the loop variable and getrefcount's own argument; a block
                # just handed to another thread is still referenced by that thread, so it is not free
                if sys.getrefcount(block) == 3 and block.shape == shape and block.dtype == dtype:
                    return block
            block = np.empty(shape, dtype)
            while self._blocks and len(self._blocks) >= max(1, self._reserved):
                self._blocks.pop(0)  # the oldest; still in use by a batch, which frees it when done
            self._blocks.append(block)
            return block


_POOLS: weakref.WeakKeyDictionary[TypedSplit, _BlockPool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _block_pool(split: TypedSplit) -> _BlockPool:
    with _POOLS_LOCK:
        pool = _POOLS.get(split)
        if pool is None:
            pool = _POOLS[split] = _BlockPool()
        return pool


def _fields(split: TypedSplit, columns: Sequence[str] | None, decoders: Mapping[str, Decoder],
            augment: Mapping[str, ImageAugment]) -> list[_Field]:
    names = [c.name for c in split.columns.values() if c.role in DEFAULT_ROLES] if columns is None else list(columns)
    for what, mapping in (("decoders", decoders), ("augment", augment)):
        stray = [n for n in mapping if n not in names]
        if stray:
            raise ValueError(f"{what} name column(s) {stray} that the loader does not yield ({names})")
    fields = []
    for name in names:
        if name not in split.columns:
            raise KeyError(f"no column {name!r}; the split has {list(split.columns)}")
        col, dec, aug = split.columns[name], decoders.get(name), augment.get(name)
        if col.kind == "ndarray" and dec is not None:
            raise ValueError(f"column {name!r} is an ndarray column: it needs no decoder")
        shape = tuple(dec.shape) if dec is not None else col.shape
        # None: the column is yielded as a list (bytes or str without a decoder)
        dtype = np.dtype(dec.dtype) if dec is not None else np.dtype(col.dtype) if col.kind == "ndarray" else None
        if dtype is not None and dtype not in _TORCH_DTYPES:
            raise ValueError(f"column {name!r} holds {dtype}, which torch has no tensor type for")
        if aug is not None and col.kind != "ndarray" and dec is None:
            raise ValueError(f"column {name!r} holds encoded samples: augmenting it needs a decoder")
        if aug is not None and dtype != np.uint8:
            raise ValueError(f"column {name!r}: augmentation needs uint8 images, the column gives {dtype}")
        out_shape = aug.output_shape(shape) if aug is not None else shape
        fields.append(_Field(col, dec, aug, shape, dtype, out_shape))
    return fields


class TypedLoader(BatchPrefetcher):
    """One epoch of a ``TypedSplit`` for this rank from ``start_step``, as dicts of column name
    to tensor (ndarray and decoded columns; pinned on CUDA, copied with ``non_blocking=True``),
    list of bytes (bytes columns without a decoder) or list of str (str columns).

    ``indices``: this rank's share of the epoch (``data.epoch_indices``); ``epoch`` and ``seed``
    key the augmentation's random choices with each sample's global index, so they depend on
    nothing else. ``columns``: what to yield (default: every input and target column).
    ``decoders``: column -> ``Decoder`` for encoded columns; ``augment``: column ->
    ``ImageAugment``. Decoding and augmentation run on ``decode_threads`` threads in all (default:
    this process's cores), the loader threads first: a load is cut into
    ``ceil(decode_threads / num_workers)`` contiguous parts, the loader thread transforms the first
    and ``pool`` (shared across epochs by the caller, or the loader's own) the others. With as many
    loader threads as decode threads each transforms its whole load, with no hand-off at all.
    ``batches_per_load``: batches made per load (default: 1 when decoding or augmenting, else
    enough for about LOAD_BYTES)."""

    def __init__(self, split: TypedSplit, indices: np.ndarray, batch_size: int, start_step: int,
                 device: torch.device, *, epoch: int, seed: int, columns: Sequence[str] | None = None,
                 decoders: Mapping[str, Decoder] | None = None, augment: Mapping[str, ImageAugment] | None = None,
                 num_workers: int = 1, prefetch_batches: int = 4, decode_threads: int | None = None,
                 pool: concurrent.futures.ThreadPoolExecutor | None = None, batches_per_load: int | None = None):
        self.split, self.device, self.epoch, self.seed = split, device, epoch, seed
        self.pin = device.type == "cuda"
        self.copy = DeviceCopier(device)  # on CUDA: a side stream, overlapping the previous step
        self.fields = _fields(split, columns, decoders or {}, augment or {})
        self.decode_threads = decode_threads or len(os.sched_getaffinity(0))
        transforms = any(f.decoder or f.augment for f in self.fields)
        # Parts of a load that are transformed side by side; the loader thread takes one itself
        # (one hand-off fewer per load: image loader CPU 230 -> 214 us/image with the zero-copy
        # JPEG views, benchmarks/typed_loaders.py).
        self.parts = max(1, math.ceil(self.decode_threads / num_workers)) if transforms else 0
        # A pool given by the caller (one for all epochs, so chained epochs that overlap do not
        # run twice the threads) stays open; one made here is shut down with the loader.
        self.own_pool = pool is None and self.parts > 1
        self.pool = (concurrent.futures.ThreadPoolExecutor(max(1, self.decode_threads - num_workers),
                                                           thread_name_prefix="shard-decode")
                     if self.own_pool else pool if self.parts > 1 else None)
        if batches_per_load is None:  # decoding dominates a load: grouping would only delay batches
            batches_per_load = 1 if transforms else self._copies_per_load(batch_size)
        super().__init__(self._load, self._deliver, indices, batch_size, start_step, num_workers, prefetch_batches,
                         batches_per_load)
        self.blocks = _block_pool(split)
        # A streamed split's cache reads ahead in this order and evicts behind it: each batch's
        # position in the epoch, found again from the batch array a load is handed (the same objects).
        ahead = self.batches[self.start:]
        self._positions = {id(b): i for i, b in enumerate(ahead)}
        self.schedule = split.plan_reads(ahead)
        # at most: per worker, its queue's loads and the one it fills; the consumer's current load and the one before
        per_field = num_workers * (self.queues[0].maxsize + 1) + 2
        self._reserved = 0 if self.pin else per_field * sum(f.is_tensor + (f.augment is not None) for f in self.fields)
        self.blocks.reserve(self._reserved)

    def _copies_per_load(self, batch_size: int) -> int:
        """Batches per load when a load only copies: enough that a load moves about LOAD_BYTES
        (a small batch's fixed costs, planning, allocation and the hand-off between threads,
        would otherwise cost more than copying it: 256 token windows are 132 KB)."""
        batch_bytes = batch_size * sum(math.prod(f.out_shape) * f.dtype.itemsize for f in self.fields if f.is_tensor)
        return max(1, min(MAX_BATCHES_PER_LOAD, LOAD_BYTES // max(1, batch_bytes)))

    def _tensor(self, f: _Field, n: int) -> torch.Tensor:
        shape = (n, *f.out_shape)
        if self.pin:
            return torch.empty(shape, dtype=f.torch_dtype, pin_memory=True)
        return torch.from_numpy(self.blocks.get(shape, f.dtype))

    def _staging(self, f: _Field, n: int) -> np.ndarray:
        """Where an augmented column is gathered or decoded before it is cropped into the batch: a
        pool block too, free again once the load is done (the batch never holds it)."""
        return self.blocks.get((n, *f.stored_shape), f.dtype)

    def _load(self, batches: list[np.ndarray]) -> list[dict[str, torch.Tensor | list]]:
        """Consecutive batches made as one block of rows, then cut into one dict per batch (views)."""
        idx = batches[0] if len(batches) == 1 else np.concatenate(batches)
        n = len(idx)
        tensors = {f.name: self._tensor(f, n) for f in self.fields if f.is_tensor}
        outs = {name: t.numpy() for name, t in tensors.items()}
        staging = {f.name: self._staging(f, n) for f in self.fields if f.augment}
        into = {f.name: staging.get(f.name, outs.get(f.name)) for f in self.fields if f.column.kind == "ndarray"}
        names = [f.name for f in self.fields]
        parts = self._cache_parts(batches)
        if len(parts) == 1:
            plan = plan_batches(self.split.starts, batches)
            # The shards stay open (pinned in a streamed split's cache) until decoding has read the views.
            with self.split.reading([s for s, _, _ in plan.segments]):
                gathered = self.split.gather_planned(plan, n, names, out=into,
                                                     views=[f.name for f in self.fields if f.decoder is not None])
                if self.parts:
                    self._transform(idx, gathered, staging, outs)
        else:  # a copy-only load of a streamed split, gathered in parts whose shards fit the cache together
            gathered, row = {}, 0
            for part in parts:
                m = sum(len(b) for b in part)
                got = self.split.gather_planned(plan_batches(self.split.starts, part), m, names,
                                                out={k: v[row:row + m] for k, v in into.items()})
                for k, v in got.items():
                    gathered[k] = into[k] if k in into else gathered.get(k, []) + v
                row += m
                # done part by part: the cache evicts what this load has finished with, not read-ahead
                self.split.reads_done(self.schedule, [self._positions[id(b)] for b in part])
        if len(parts) == 1:
            self.split.reads_done(self.schedule, [self._positions[id(b)] for b in batches])
        rows: dict[str, torch.Tensor | list] = {}
        for f in self.fields:
            if f.is_tensor:
                rows[f.name] = tensors[f.name]
            elif f.column.kind == "str":
                rows[f.name] = [v.decode("utf-8") for v in gathered[f.name]]
            else:
                rows[f.name] = gathered[f.name]
        cuts = np.cumsum([0] + [len(b) for b in batches]).tolist()
        return [{name: v[a:e] for name, v in rows.items()} for a, e in zip(cuts, cuts[1:])]

    def _cache_parts(self, batches: list[np.ndarray]) -> list[list[np.ndarray]]:
        """The load's batches in consecutive parts whose s3:// shards fit together in this loader
        threads' share of a streamed split's cache (one part: the whole load). A load of several
        batches only copies (decoding loads one batch), so its parts need not stay open together."""
        budget = self.split.cache_budget()
        if budget is None or len(batches) == 1:
            return [batches]
        budget //= self.num_workers
        if self.split.cached_bytes() <= budget:  # the whole split fits: so does any load of it
            return [batches]
        parts, current, held = [], [], set()
        for b in batches:
            shards = set(np.unique(np.searchsorted(self.split.starts, b, side="right") - 1).tolist())
            union = held | shards
            if current and self.split.cached_bytes(union) > budget:
                parts.append(current)
                current, union = [], shards
            current.append(b)
            held = union
        parts.append(current)
        return parts

    def _transform(self, idx: np.ndarray, gathered: dict, staging: dict[str, np.ndarray],
                   outs: dict[str, np.ndarray]) -> None:
        draws = {f.name: f.augment.draws(self.seed, self.epoch, idx, f.stored_shape)
                 for f in self.fields if f.augment}
        cuts = np.linspace(0, len(idx), min(len(idx), self.parts) + 1).astype(int).tolist()
        parts = [range(a, b) for a, b in zip(cuts, cuts[1:])]
        if not parts:
            return
        futures = [self.pool.submit(self._transform_rows, rows, idx, gathered, staging, outs, draws)
                   for rows in parts[1:]]
        try:
            self._transform_rows(parts[0], idx, gathered, staging, outs, draws)
        finally:  # every part has finished before the first error in batch order is raised
            concurrent.futures.wait(futures)
        for fut in futures:
            fut.result()

    def _transform_rows(self, rows: range, idx: np.ndarray, gathered: dict, staging: dict[str, np.ndarray],
                        outs: dict[str, np.ndarray], draws: dict[str, AugmentDraws]) -> None:
        for f in self.fields:
            if f.decoder is not None:
                self._decode_rows(f, rows, idx, gathered[f.name], staging.get(f.name, outs[f.name]))
            if f.augment is not None:
                f.augment.apply(staging[f.name], draws[f.name], rows, outs[f.name])

    def _decode_rows(self, f: _Field, rows: range, idx: np.ndarray, values: list[bytes], dest: np.ndarray) -> None:
        for i in rows:
            try:
                f.decoder(values[i], dest[i])
            except Exception as e:
                shard, row = self.split.locate(int(idx[i]))
                raise DataError(f"column {f.name!r}: cannot decode sample {int(idx[i])} (row {row} of shard "
                                f"{shard!r}): {type(e).__name__}: {e}") from e

    def _deliver(self, batch: dict[str, torch.Tensor | list]) -> dict[str, torch.Tensor | list]:
        return self.copy(batch)

    def close(self) -> None:
        super().close()
        self.split.unplan_reads(self.schedule)
        self.schedule = None
        self.blocks.release(self._reserved)
        self._reserved = 0
        if self.own_pool:
            self.pool.shutdown(wait=False, cancel_futures=True)
