"""The v1 shard format (float32 features and int64 labels per shard) and its loader."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training_runtime.data.device_copy import DeviceCopier
from training_runtime.data.gather import plan_rows, take_rows
from training_runtime.data.prefetch import BatchPrefetcher
from training_runtime.data.shards import DataError


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


# ---------------------------------------------------------------- background loader
@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor


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
