"""Shard format v2 (typed columns, ``training_runtime.data.shard_format``) read in the runtime.

``TypedSplit`` memory-maps a split's shards and gathers a batch of samples per column: fixed-shape
columns the way ``SplitData`` gathers v1 features (``data.plan_rows`` / ``data.take_rows``: one
``np.take`` per shard straight from the memory map), variable-length columns as lists of bytes.
``open_split`` opens a split of either format. The loader is ``training_runtime.data.loader``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from training_runtime.data.gather import RowPlan, plan_rows, take_rows
from training_runtime.data.shard_format import (
    FORMAT_V1,
    FORMAT_V2,
    Column,
    ShardColumns,
    ShardFormatError,
    columns_from_manifest,
)
from training_runtime.data.shards import DataError
from training_runtime.data.v1 import SplitData


def open_split(manifest: dict, paths: list[Path], split: str) -> SplitData | TypedSplit:
    """A split of a v1 manifest as ``SplitData``, of a v2 manifest as ``TypedSplit``."""
    fmt = manifest.get("format")
    if fmt == FORMAT_V1:
        return SplitData(manifest, paths, split)
    if fmt == FORMAT_V2:
        return TypedSplit(manifest, paths, split)
    raise DataError(f"manifest format {fmt!r} is neither {FORMAT_V1!r} nor {FORMAT_V2!r}")


def _open_shard(path: Path, entry: dict, columns: list[Column], split: str) -> ShardColumns:
    try:
        return ShardColumns(path, entry, columns)
    except (ShardFormatError, KeyError, ValueError, OSError) as e:
        raise DataError(f"split {split!r}: shard {entry.get('path')!r} ({path}) is unreadable: "
                        f"{type(e).__name__}: {e}; re-materialize the shards") from e


class TypedSplit:
    """One v2 split memory-mapped: per column, one zero-copy view per shard."""

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
        self._arrays = {n: [np.asarray(s.arrays[n]) for s in shards] for n in fixed}
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
            for name, arr in zip(self.shard_names, self._arrays[col.name]):
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
        the fast path: one ``np.take`` per shard straight from the memory map."""
        idx = np.asarray(idx, dtype=np.int64)
        return self.gather_planned(plan_rows(self.starts, idx), len(idx), columns, out)

    def gather_planned(self, plan: RowPlan, n: int, columns: Sequence[str] | None = None,
                       out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray | list[bytes]]:
        """``gather`` of ``n`` rows already planned (``data.plan_rows`` / ``data.plan_batches``)."""
        names = list(self.columns) if columns is None else list(columns)
        unknown = [c for c in names if c not in self.columns]
        if unknown:
            raise KeyError(f"no column(s) {unknown}; the split has {list(self.columns)}")
        result: dict[str, np.ndarray | list[bytes]] = {}
        for name in names:
            col = self.columns[name]
            if col.kind == "ndarray":
                dest = self._output(col, n, (out or {}).get(name))
                take_rows(self._arrays[name], plan, dest)
                result[name] = dest
            else:
                result[name] = self._gather_bytes(name, plan)
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

    def _gather_bytes(self, name: str, plan: RowPlan) -> list[bytes]:
        values: list[bytes] = []
        for s, a, e in plan.segments:
            payload, offsets, rows = self._payloads[name][s], self._offsets[name][s], plan.local[a:e]
            begins, ends = offsets[rows].tolist(), offsets[rows + 1].tolist()
            values.extend(bytes(payload[b:f]) for b, f in zip(begins, ends))
        if plan.order is None:
            return values
        ordered: list[bytes] = [b""] * len(values)
        for k, pos in enumerate(plan.order.tolist()):
            ordered[pos] = values[k]
        return ordered
