"""Typed columns (``training_runtime.data.shard_format``) read in the runtime, for every shard format.

``TypedSplit`` memory-maps a split's shards (all at once, or each as it is first read when the
split streams through a ``data.cache.ShardCache``) and gathers a batch of samples per column: fixed-shape
columns with ``data.gather.ColumnRows`` (one copy per shard straight from the memory map into the
batch), variable-length columns as lists of bytes (or zero-copy views, for a loader that decodes them). ``open_split`` opens a split of either format:
a v1 manifest is read through ``shard_format.as_v2``, as the columns ``features`` and ``label`` of
the same files. The loader is ``training_runtime.data.loader``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from training_runtime.data.gather import ColumnRows, RowPlan, plan_rows
from training_runtime.data.shard_format import (
    Column,
    ShardColumns,
    ShardFormatError,
    as_v2,
    columns_from_manifest,
    read_normalisation,
)
from training_runtime.data.cache import Schedule, ShardCache, ShardRef
from training_runtime.data.shards import DataError


def open_split(manifest: dict, paths: list[Path], split: str) -> TypedSplit:
    """A split of a v1 or v2 manifest as a ``TypedSplit`` (v1: columns ``features`` and ``label``),
    every shard mapped at once from ``paths`` (already fetched and checked: ``resolve_shards``)."""
    return TypedSplit(_typed(manifest), paths, split)


def open_streaming_split(manifest: dict, refs: list[ShardRef], split: str, cache: ShardCache) -> TypedSplit:
    """A split whose shards are opened as they are read: file:// shards in place (checked once
    when first opened), s3:// shards through ``cache`` (fetched on demand and ahead, evicted when
    done; ``data.cache``)."""
    return TypedSplit(_typed(manifest), None, split, refs=refs, cache=cache)


def _typed(manifest: dict) -> dict:
    try:
        return as_v2(manifest)
    except ShardFormatError as e:
        raise DataError(str(e)) from e


def _open_shard(path: Path, entry: dict, columns: list[Column], split: str) -> ShardColumns:
    try:
        return ShardColumns(path, entry, columns)
    except (ShardFormatError, KeyError, ValueError, OSError) as e:
        raise DataError(f"split {split!r}: shard {entry.get('path')!r} ({path}) is unreadable: "
                        f"{type(e).__name__}: {e}; re-materialize the shards") from e


class TypedSplit:
    """One split of a v2 manifest (``open_split`` reads v1 ones as v2) memory-mapped: per column,
    one zero-copy view per shard.

    With ``paths`` every shard is mapped at once. With ``refs`` and ``cache`` (a streamed split)
    a shard is mapped when a gather first reads it and unmapped when the cache evicts it;
    ``reading(shards)`` holds shards open (pinned in the cache) around a read, and a reader that
    knows its order registers it (``plan_reads``) so the cache fetches ahead and evicts behind."""

    def __init__(self, manifest: dict, paths: list[Path] | None, split: str, *,
                 refs: list[ShardRef] | None = None, cache: ShardCache | None = None):
        try:
            self.columns = {c.name: c for c in columns_from_manifest(manifest)}
        except (ShardFormatError, KeyError) as e:
            raise DataError(f"manifest columns are invalid: {e}") from e
        try:  # a table whose shards hold its features raw: normalised as they are gathered
            self._normalise = read_normalisation(manifest)
        except ShardFormatError as e:
            raise DataError(str(e)) from e
        if split not in manifest["splits"]:
            raise DataError(f"manifest has no split {split!r}; it has {sorted(manifest['splits'])}")
        self.name = split
        entries = manifest["splits"][split]["shards"]
        given = paths if paths is not None else refs
        if given is None or (paths is None) == (cache is None):
            raise ValueError("TypedSplit takes either paths, or refs and a cache")
        if len(entries) != len(given):
            raise DataError(f"split {split!r} has {len(entries)} shards, {len(given)} paths were given")
        self._entries, self._cols = entries, list(self.columns.values())
        self._refs, self._cache = refs, cache
        self.shard_names = [e["path"] for e in entries]
        n = len(entries)
        self._fixed = [c.name for c in self._cols if c.kind == "ndarray"]
        self._variable = [c.name for c in self._cols if c.kind != "ndarray"]
        self._rows = {c.name: ColumnRows([None] * n, sample_bytes=c.sample_bytes) for c in self._cols
                      if c.kind == "ndarray"}
        self._offsets: dict[str, list] = {name: [None] * n for name in self._variable}
        self._payloads: dict[str, list] = {name: [None] * n for name in self._variable}
        self._shards: list[ShardColumns | None] = [None] * n  # keeps the maps open
        self._lock = threading.Lock()
        self.starts = np.concatenate([[0], np.cumsum([int(e["num_samples"]) for e in entries], dtype=np.int64)])
        self.num_samples = int(self.starts[-1])
        declared = manifest["splits"][split].get("num_samples", self.num_samples)
        if declared != self.num_samples:
            raise DataError(f"split {split!r}: the manifest says {declared} samples, its shards hold "
                            f"{self.num_samples}")
        self._num_classes = manifest.get("num_classes")
        if paths is not None:
            for s, p in enumerate(paths):
                self._open(s, Path(p))
        else:
            # per shard, the bytes it takes in the cache (file:// shards, read in place, take none):
            # a load asks for them on every batch, so they are worked out once
            self._cache_bytes = [0 if r.is_local else r.num_bytes for r in refs]
            self._cached_total = sum(self._cache_bytes)
            self._by_key: dict[str, list[int]] = {}
            for s, r in enumerate(refs):
                self._by_key.setdefault(r.sha256, []).append(s)
            cache.register(refs)
            cache.add_listener(self._evicted)
            weakref.finalize(self, cache.remove_listener, self._evicted)

    @property
    def streamed(self) -> bool:
        return self._cache is not None

    # ------------------------------------------------------------ opening and closing shards
    def _open(self, s: int, path: Path) -> None:
        shard = _open_shard(path, self._entries[s], self._cols, self.name)
        if shard.num_samples != self.starts[s + 1] - self.starts[s]:
            raise DataError(f"split {self.name!r}: shard {self.shard_names[s]!r} holds {shard.num_samples} samples, "
                            f"the manifest says {int(self.starts[s + 1] - self.starts[s])}")
        self._check_targets(s, shard)
        # Plain ndarray views: np.memmap's subclass hooks cost on every gather call.
        for name in self._fixed:
            self._rows[name].put(s, np.asarray(shard.arrays[name]))
        for name in self._variable:
            self._offsets[name][s] = np.asarray(shard.offsets[name])
            self._payloads[name][s] = memoryview(np.asarray(shard.payloads[name]))
        self._shards[s] = shard

    def _evicted(self, sha256: str) -> None:
        """The cache deletes this shard's file: drop every view of its map first (a mapped file's
        disk space is freed only once it is unmapped). The cache evicts only unpinned shards, so
        no gather is reading it."""
        with self._lock:
            for s in self._by_key.get(sha256, ()):
                for rows in self._rows.values():
                    rows.drop(s)
                for name in self._variable:
                    self._offsets[name][s] = None
                    self._payloads[name][s] = None
                self._shards[s] = None

    @contextlib.contextmanager
    def reading(self, shards: Collection[int]) -> Iterator[None]:
        """Shards ``shards`` (indices) open and kept open for the block (fetched first if need be)."""
        if self._cache is None:
            yield
            return
        refs = [self._refs[s] for s in shards]
        paths = self._cache.acquire(refs)
        try:
            with self._lock:
                for s, p in zip(shards, paths):
                    if self._shards[s] is None:
                        self._open(s, p)
            yield
        finally:
            self._cache.release(refs)

    def cache_budget(self) -> int | None:
        """Bytes this split's cache may hold (None: nothing is cached, every shard is read in place)."""
        if self._cache is None or not self._cached_total:
            return None
        return self._cache.limit

    def cached_bytes(self, shards: Collection[int] | None = None) -> int:
        """What these shards (None: all of the split's) take in the cache (file:// shards take none)."""
        if self._cache is None:
            return 0
        return self._cached_total if shards is None else sum(self._cache_bytes[s] for s in shards)

    def plan_reads(self, batches: Sequence[np.ndarray]) -> Schedule | None:
        """Tell the cache the order this reader gathers ``batches`` in (None: nothing to tell)."""
        if self._cache is None:
            return None
        return self._cache.plan(Schedule([r.sha256 for r in self._refs], self.starts, batches))

    def reads_done(self, schedule: Schedule | None, positions: Sequence[int]) -> None:
        if schedule is not None:
            self._cache.done(schedule, positions)

    def unplan_reads(self, schedule: Schedule | None) -> None:
        if schedule is not None:
            self._cache.unplan(schedule)

    def _check_targets(self, s: int, shard: ShardColumns) -> None:
        """Scalar integer targets outside [0, num_classes) would fail deep inside the loss (a CUDA
        device assert); refuse them when the shard is opened, naming it."""
        nc = self._num_classes
        if nc is None:
            return
        for col in self.columns.values():
            if col.role != "target" or col.kind != "ndarray" or col.shape or np.dtype(col.dtype).kind not in "iu":
                continue
            arr = shard.arrays[col.name]
            bad = (arr < 0) | (arr >= nc)
            if bad.any():
                raise DataError(f"split {self.name!r} shard {self.shard_names[s]!r} column {col.name!r} holds "
                                f"{int(arr[int(np.argmax(bad))])} outside [0, num_classes={nc})")

    def locate(self, index: int) -> tuple[str, int]:
        """The shard holding global sample ``index`` and the sample's row in it."""
        s = int(np.searchsorted(self.starts, index, side="right") - 1)
        return self.shard_names[s], int(index - self.starts[s])

    def gather(self, idx: np.ndarray, columns: Sequence[str] | None = None,
               out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray | list[bytes]]:
        """The given samples, in that order: ndarray columns as one contiguous array each (into
        ``out[name]`` when given), bytes and str columns as lists of bytes. Sorted indices take
        the fast path: one copy per shard straight from the memory map."""
        idx = np.asarray(idx, dtype=np.int64)
        return self.gather_planned(plan_rows(self.starts, idx), len(idx), columns, out)

    def gather_planned(self, plan: RowPlan, n: int, columns: Sequence[str] | None = None,
                       out: Mapping[str, np.ndarray] | None = None, views: Collection[str] = ()
                       ) -> dict[str, np.ndarray | list[bytes] | list[memoryview]]:
        """``gather`` of ``n`` rows already planned (``data.plan_rows`` / ``data.plan_batches``).
        Variable-length columns named in ``views`` come as memoryviews into the memory map instead
        of bytes: no copy, for a caller that only reads them while the split is open (a decoder; on a
        streamed split, inside ``reading`` of the plan's shards, which keeps them mapped)."""
        names = list(self.columns) if columns is None else list(columns)
        unknown = [c for c in names if c not in self.columns]
        if unknown:
            raise KeyError(f"no column(s) {unknown}; the split has {list(self.columns)}")
        result: dict[str, np.ndarray | list[bytes]] = {}
        with self.reading([s for s, _, _ in plan.segments]):
            for name in names:
                self._gather_column(name, plan, n, out, views, result)
        return result

    def _gather_column(self, name: str, plan: RowPlan, n: int, out, views: Collection[str], result: dict) -> None:
        col = self.columns[name]
        if col.kind == "ndarray":
            dest = self._output(col, n, (out or {}).get(name))
            self._rows[name].take(plan, dest)
            if n and name in self._normalise:  # in place, as the shards of older manifests were written
                mean, std = self._normalise[name]
                flat = dest.reshape(n, -1)
                flat -= mean
                flat /= std
            result[name] = dest
        else:
            result[name] = self._gather_bytes(name, plan, name in views)

    @staticmethod
    def _output(col: Column, n: int, given: np.ndarray | None) -> np.ndarray:
        want, dtype = (n, *col.shape), np.dtype(col.dtype)
        if given is None:
            return np.empty(want, dtype=dtype)
        if given.shape != want or given.dtype != dtype or not given.flags.c_contiguous:
            raise ValueError(f"out[{col.name!r}] is {given.dtype}{list(given.shape)}, the batch needs a "
                             f"contiguous {dtype}{list(want)}")
        return given

    def _gather_bytes(self, name: str, plan: RowPlan, as_views: bool) -> list[bytes] | list[memoryview]:
        values: list = []
        for s, a, e in plan.segments:
            payload, offsets, rows = self._payloads[name][s], self._offsets[name][s], plan.local[a:e]
            begins, ends = offsets[rows].tolist(), offsets[rows + 1].tolist()
            if as_views:
                values.extend(payload[b:f] for b, f in zip(begins, ends))
            else:
                values.extend(bytes(payload[b:f]) for b, f in zip(begins, ends))
        if plan.order is None:
            return values
        ordered: list = [b""] * len(values)
        for k, pos in enumerate(plan.order.tolist()):
            ordered[pos] = values[k]
        return ordered
