"""Shard data path: locate and verify shards, memory-map them, partition samples over ranks with
DistributedSampler semantics and gather whole batches in background threads."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training_runtime.atomic_files import atomic_path
from training_runtime.device_copy import DeviceCopier

log = logging.getLogger(__name__)


class DataError(RuntimeError):
    """A shard is missing, corrupt or unreadable; the message names the shard and the fix."""


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


# ---------------------------------------------------------------- shard access
def sha256_file(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fetch_s3(url: str, dest: Path, endpoint_url: str | None) -> None:
    import boto3  # only needed for s3:// locations

    parsed = urllib.parse.urlparse(url)
    client = boto3.client("s3", endpoint_url=endpoint_url)
    try:
        client.download_file(parsed.netloc, parsed.path.lstrip("/"), str(dest))
    except Exception as e:
        dest.unlink(missing_ok=True)
        raise DataError(f"cannot download shard {url} (endpoint {endpoint_url}): {e}; check the "
                        "URL in data.locations, data.s3_endpoint_url and the AWS_* credentials") from e


def _download_to_cache(url: str, local: Path, shard: dict, endpoint_url: str | None) -> None:
    """Fetch a shard into the cache under its final name only once it is whole, checked and on
    disk: a shard cut short by a crash or a failed check never looks cached."""
    with atomic_path(local) as tmp:
        _fetch_s3(url, tmp, endpoint_url)
        _check_shard(tmp, shard, url)


def _check_shard(local: Path, shard: dict, url: str) -> None:
    size = local.stat().st_size
    if size != shard["num_bytes"]:
        raise DataError(f"shard {shard['path']!r} at {url} has {size} bytes, manifest says "
                        f"{shard['num_bytes']}; the shard does not belong to this manifest")
    digest = sha256_file(local)
    if digest != shard["sha256"]:
        raise DataError(f"checksum mismatch for shard {shard['path']!r} at {url}: sha256 "
                        f"{digest} != manifest {shard['sha256']}; the shard is corrupt or from "
                        "another commit; re-materialize the shards")


def resolve_shards(manifest: dict, locations: dict[str, str], split: str, cache_dir: str | None,
                   s3_endpoint_url: str | None = None, verify: bool = True) -> list[Path]:
    """Local paths of the split's shards. s3:// shards are downloaded into ``cache_dir`` as
    ``<sha256>.bin`` and enter the cache only after their size and sha256 match the manifest;
    with ``verify`` every shard (cached or file://) is checked again. Raises ``DataError`` naming
    the shard."""
    if split not in manifest["splits"]:
        raise DataError(f"manifest has no split {split!r}; it has {sorted(manifest['splits'])}")
    paths = []
    for shard in manifest["splits"][split]["shards"]:
        url = locations.get(shard["path"])
        if url is None:
            raise DataError(f"data.locations has no entry for shard {shard['path']!r}")
        if url.startswith("file://"):
            local = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
            if not local.is_file():
                raise DataError(f"shard {shard['path']!r} is missing: {local} does not exist; "
                                f"re-materialize the shards or fix data.locations")
            if verify:
                _check_shard(local, shard, url)
        elif url.startswith("s3://"):
            if cache_dir is None:
                raise DataError("data.cache_dir is required for s3:// shards")
            os.makedirs(cache_dir, exist_ok=True)
            local = Path(cache_dir) / f"{shard['sha256']}.bin"
            if not local.is_file():
                _download_to_cache(url, local, shard, s3_endpoint_url)
            elif verify:
                try:
                    _check_shard(local, shard, url)
                except DataError:
                    local.unlink(missing_ok=True)  # a corrupt cached copy is fetched again next time
                    raise
        else:
            raise DataError(f"unsupported location {url!r} for shard {shard['path']!r}")
        paths.append(local)
    return paths


class SplitData:
    """One split memory-mapped: features per shard (zero-copy) and all labels in memory."""

    def __init__(self, manifest: dict, paths: list[Path], split: str):
        self.feature_shape = tuple(manifest["feature_shape"])
        dim = math.prod(self.feature_shape)
        shards = manifest["splits"][split]["shards"]
        self.features: list[np.memmap] = []
        labels = []
        for shard, path in zip(shards, paths, strict=True):
            n = shard["num_samples"]
            self.features.append(np.memmap(path, dtype="<f4", mode="r", shape=(n, *self.feature_shape)))
            labels.append(np.memmap(path, dtype="<i8", mode="r", offset=n * dim * 4, shape=(n,)))
        self.labels = np.ascontiguousarray(np.concatenate(labels)).astype(np.int64, copy=False)
        self._arrays = [np.asarray(f) for f in self.features]  # views: the maps stay open through .base
        counts = np.array([s["num_samples"] for s in shards])
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_samples = int(self.starts[-1])
        nc = manifest["num_classes"]
        bad = (self.labels < 0) | (self.labels >= nc)
        if bad.any():
            i = int(np.argmax(bad))
            shard_i = int(np.searchsorted(self.starts, i, side="right") - 1)
            raise DataError(f"split {split!r} shard {shards[shard_i]['path']!r} holds label "
                            f"{int(self.labels[i])} outside [0, num_classes={nc})")

    def gather(self, idx: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of the given sample indices, in that order, in one contiguous array.
        Sorted indices (what the loader asks for) take the fast path: one ``np.take`` per shard
        straight from the memory map into ``out``, reading each shard front to back."""
        idx = np.asarray(idx, dtype=np.int64)
        if out is None:
            out = np.empty((len(idx), *self.feature_shape), dtype=np.float32)
        if len(idx) == 0:
            return out, self.labels[idx]
        take_rows(self._arrays, plan_rows(self.starts, idx), out)
        return out, self.labels[idx]

    def load_batch(self, idx: np.ndarray, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch as tensors, in pinned memory when ``pin`` (run in the loader's threads)."""
        if pin:
            xt = torch.empty((len(idx), *self.feature_shape), pin_memory=True)
            _, y = self.gather(idx, out=xt.numpy())
            return xt, torch.from_numpy(y).pin_memory()
        x, y = self.gather(idx)
        return torch.from_numpy(x), torch.from_numpy(y)


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


# ---------------------------------------------------------------- background loader
@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor


class _Stop(Exception):
    pass


def sorted_batches(indices: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """``indices`` cut into batches, each in index order (the loss is a mean, so order within a
    batch does not matter) so that gathering reads each shard front to back. One sort for all full
    batches: a sort call per batch cost more than the sorting when batches are small."""
    full = len(indices) // batch_size * batch_size
    batches = list(np.sort(indices[:full].reshape(-1, batch_size), axis=1))
    if full < len(indices):
        batches.append(np.sort(indices[full:]))
    return batches


class BatchPrefetcher:
    """Iterates one epoch of batches for this rank from ``start_step``. Batches are loaded
    ``batches_per_load`` at a time (consecutive ones): ``num_workers`` threads each load every
    num_workers-th load into its own bounded queue; the consumer reads the queues round-robin, so
    order is deterministic. ``load_batches(list of sorted index arrays)`` runs in those threads and
    returns the batches made on the host; ``deliver(item)`` runs on the consumer (it moves a batch
    to the device). ``wait_s`` accumulates the time the consumer waited.

    Loading several batches at once amortises the fixed cost of a load (planning, allocation, a
    queue hand-off between threads) when batches are small.

    ``then`` (set by ``chained_epochs``) is the next epoch's loader: it is started once this
    loader's remaining batches are all in flight, so the next epoch's first batches are ready when
    this epoch ends instead of being gathered while training waits."""

    def __init__(self, load_batches: Callable[[list[np.ndarray]], list], deliver: Callable[[object], object],
                 indices: np.ndarray, batch_size: int, start_step: int, num_workers: int = 1,
                 prefetch_batches: int = 4, batches_per_load: int = 1):
        self.load_batches, self.deliver = load_batches, deliver
        self.batches = sorted_batches(indices, batch_size)
        self.start = start_step
        self.num_workers = num_workers
        self.per_load = max(1, batches_per_load)
        depth = max(1, math.ceil(prefetch_batches / (num_workers * self.per_load)))
        self.queues: list[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(num_workers)]
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.wait_s = 0.0
        self.lookahead = depth * num_workers * self.per_load
        self.then: BatchPrefetcher | None = None

    def __len__(self) -> int:
        return len(self.batches) - self.start

    def _produce(self, w: int) -> None:
        q, step = self.queues[w], self.num_workers * self.per_load
        try:
            for b in range(self.start + w * self.per_load, len(self.batches), step):
                self._put(q, self.load_batches(self.batches[b:b + self.per_load]))
        except _Stop:
            return
        except BaseException as e:  # handed to the consumer, which re-raises it
            try:
                self._put(q, e)
            except _Stop:
                pass

    def _put(self, q: queue.Queue, item: object) -> None:
        while True:
            if self.stop.is_set():
                raise _Stop
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def start_gathering(self) -> None:
        """Start the loader threads (idempotent; iterating starts them too)."""
        if self.threads or self.stop.is_set():
            return
        self.threads = [threading.Thread(target=self._produce, args=(w,), daemon=True,
                                         name=f"shard-loader-{w}") for w in range(self.num_workers)]
        for t in self.threads:
            t.start()

    def __iter__(self) -> Iterator:
        self.start_gathering()
        start_next_at = max(self.start, len(self.batches) - self.lookahead)
        loaded: list = []
        try:
            for b in range(self.start, len(self.batches)):
                if b == start_next_at and self.then is not None:
                    self.then.start_gathering()
                t0 = time.perf_counter()
                pos = b - self.start
                if pos % self.per_load == 0:  # the next load, from the worker whose turn it is
                    loaded = self.queues[pos // self.per_load % self.num_workers].get()
                    if isinstance(loaded, BaseException):
                        last = min(b + self.per_load, len(self.batches)) - 1
                        which = f"batch {b}" if last == b else f"batches {b}-{last}"
                        raise DataError(f"loading {which} failed: {loaded}") from loaded
                batch = self.deliver(loaded[pos % self.per_load])
                self.wait_s += time.perf_counter() - t0
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)


class PrefetchLoader(BatchPrefetcher):
    """The v1 loader: batches of a ``SplitData`` as ``Batch(x, y)``. On CUDA batches land in
    pinned memory and are copied on a side stream (``device_copy``)."""

    def __init__(self, data: SplitData, indices: np.ndarray, batch_size: int, start_step: int,
                 device: torch.device, num_workers: int = 1, prefetch_batches: int = 4):
        self.data = data
        self.device = device
        self.pin = device.type == "cuda"
        self.copy = DeviceCopier(device)
        super().__init__(self._load, self._deliver, indices, batch_size, start_step, num_workers,
                         prefetch_batches)

    def _load(self, batches: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.data.load_batch(idx, self.pin) for idx in batches]

    def _deliver(self, item: tuple[torch.Tensor, torch.Tensor]) -> Batch:
        x, y = self.copy(item)
        return Batch(x, y)


def chained_epochs(make_loader: Callable[[int, int], BatchPrefetcher], start_step: int, steps_per_epoch: int,
                   total_steps: int) -> Iterator[tuple[int, BatchPrefetcher]]:
    """``(epoch, loader)`` from ``start_step``'s epoch on, ``make_loader(epoch, first_step_in_epoch)``
    building each; every loader starts the next one's gathering before its own epoch ends.
    Loaders are closed when their epoch is done or the caller stops iterating; nothing is
    yielded when ``start_step`` is already ``total_steps`` (a finished run resumed)."""
    if start_step >= total_steps:
        return
    epoch, in_epoch = divmod(start_step, steps_per_epoch)
    loader, upcoming = make_loader(epoch, in_epoch), None
    try:
        while True:
            upcoming = make_loader(epoch + 1, 0) if (epoch + 1) * steps_per_epoch < total_steps else None
            loader.then = upcoming
            yield epoch, loader
            loader.close()
            if upcoming is None:
                return
            epoch, loader, upcoming = epoch + 1, upcoming, None
    finally:
        loader.close()
        if upcoming is not None:
            upcoming.close()
