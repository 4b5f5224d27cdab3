"""Typed columns (``training_runtime.data.shard_format``) read in the runtime, for every shard format.

``TypedSplit`` memory-maps a split's shards and gathers a batch of samples per column: fixed-shape
columns with ``data.gather.ColumnRows`` (one copy per shard straight from the memory map into the
batch), variable-length columns as lists of bytes (or zero-copy views, for a loader that decodes them). ``open_split`` opens a split of either format:
a v1 manifest is read through ``shard_format.as_v2``, as the columns ``features`` and ``label`` of
the same files. The loader is ``training_runtime.data.loader``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np

from training_runtime.data.gather import ColumnRows, RowPlan, plan_rows
from training_runtime.data.shard_format import (
    Column,
    ShardColumns,
    ShardFormatError,
    as_v2,
    columns_from_manifest,
)
from training_runtime.data.shards import DataError


def open_split(manifest: dict, paths: list[Path], split: str) -> TypedSplit:
    """A split of a v1 or v2 manifest as a ``TypedSplit`` (v1: columns ``features`` and ``label``)."""
    try:
        typed = as_v2(manifest)
    except ShardFormatError as e:
        raise DataError(str(e)) from e
    return TypedSplit(typed, paths, split)


def _open_shard(path: Path, entry: dict, columns: list[Column], split: str) -> ShardColumns:
    try:
        return ShardColumns(path, entry, columns)
    except (ShardFormatError, KeyError, ValueError, OSError) as e:
        raise DataError(f"split {split!r}: shard {entry.get('path')!r} ({path}) is unreadable: "
                        f"{type(e).__name__}: {e}; re-materialize the shards") from e


class TypedSplit:
    """One split of a v2 manifest (``open_split`` reads v1 ones as v2) memory-mapped: per column,
    one zero-copy view per shard."""

    def __init__(self, manifest: dict, paths: list[Path], split: str):
        try:
            self.columns = {c.name: c for c in columns_from_manifest(manifest)}
        except (ShardFormatError, KeyError) as e:
            raise DataError(f"manifest columns are invalid: {e}") from e
        if split not in manifest["splits"]:
            raise DataError(f"manifest has no split {split!r}; it has {sorted(manifest['splits'])}")
        entries = manifest["splits"][split]["shards"]
        if len(entries) != len(paths):
            raise DataError(f"split {split!r} has {len(entries)} shards, {len(paths)} paths were given")
        cols = list(self.columns.values())
        shards = [_open_shard(p, e, cols, split) for p, e in zip(paths, entries)]
        self.shard_names = [e["path"] for e in entries]
        fixed = [c.name for c in cols if c.kind == "ndarray"]
        variable = [c.name for c in cols if c.kind != "ndarray"]
        # Plain ndarray views: np.memmap's subclass hooks cost on every gather call.
        self._rows = {n: ColumnRows([np.asarray(s.arrays[n]) for s in shards]) for n in fixed}
        self._offsets = {n: [np.asarray(s.offsets[n]) for s in shards] for n in variable}
        self._payloads = {n: [memoryview(np.asarray(s.payloads[n])) for s in shards] for n in variable}
        self._shards = shards  # keeps the maps open
        self.starts = np.concatenate([[0], np.cumsum([s.num_samples for s in shards], dtype=np.int64)])
        self.num_samples = int(self.starts[-1])
        declared = manifest["splits"][split].get("num_samples", self.num_samples)
        if declared != self.num_samples:
            raise DataError(f"split {split!r}: the manifest says {declared} samples, its shards hold "
                            f"{self.num_samples}")
        self._check_targets(manifest, split)

    def _check_targets(self, manifest: dict, split: str) -> None:
        """Scalar integer targets outside [0, num_classes) would fail deep inside the loss (a CUDA
        device assert); refuse them here, naming the shard."""
        nc = manifest.get("num_classes")
        if nc is None:
            return
        for col in self.columns.values():
            if col.role != "target" or col.kind != "ndarray" or col.shape or np.dtype(col.dtype).kind not in "iu":
                continue
            for name, arr in zip(self.shard_names, self._rows[col.name].arrays):
                bad = (arr < 0) | (arr >= nc)
                if bad.any():
                    raise DataError(f"split {split!r} shard {name!r} column {col.name!r} holds "
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
        of bytes: no copy, for a caller that only reads them while the split is open (a decoder)."""
        names = list(self.columns) if columns is None else list(columns)
        unknown = [c for c in names if c not in self.columns]
        if unknown:
            raise KeyError(f"no column(s) {unknown}; the split has {list(self.columns)}")
        result: dict[str, np.ndarray | list[bytes]] = {}
        for name in names:
            col = self.columns[name]
            if col.kind == "ndarray":
                dest = self._output(col, n, (out or {}).get(name))
                self._rows[name].take(plan, dest)
                result[name] = dest
            else:
                result[name] = self._gather_bytes(name, plan, name in views)
        return result

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
