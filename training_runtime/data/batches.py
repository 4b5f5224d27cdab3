"""Loaders over a split of either shard format, yielding what the tasks take: ``{"input": model
input, "target": targets}`` (``data_info.model_batch``).

v1 splits go through ``data.PrefetchLoader`` (features and labels); v2 splits through
``typed_loader.TypedLoader``, which decodes JPEG columns and applies the seeded image
augmentation on its threads. Both are ``data.BatchPrefetcher``s, so sampling, resume mid-epoch
and epoch chaining are the same for every kind of data."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import numpy as np
import torch

from training_runtime.data.augment import ImageAugment
from training_runtime.data.decode import ImageDecoder
from training_runtime.data.info import DataInfo, model_batch
from training_runtime.data.loader import TypedLoader
from training_runtime.data.prefetch import BatchPrefetcher
from training_runtime.data.v1 import Batch, PrefetchLoader, SplitData


def split_loader(data, info: DataInfo, indices: np.ndarray, batch_size: int, start_step: int,
                 device: torch.device, *, epoch: int, seed: int, augment=None, num_workers: int = 1,
                 prefetch_batches: int = 4, pool: concurrent.futures.ThreadPoolExecutor | None = None
                 ) -> BatchPrefetcher:
    """One epoch's batches of ``indices`` from ``start_step``. ``augment``: a config with
    ``padding`` and ``hflip`` (images only), or None."""
    if isinstance(data, SplitData):
        return PrefetchLoader(data, indices, batch_size, start_step, device, num_workers, prefetch_batches)
    columns = [info.input_column] + ([info.target_column] if info.target_column else [])
    decoders = {}
    if info.encoded:
        h, w, c = info.input_shape
        decoders[info.input_column] = ImageDecoder(h, w, c)
    augments = {}
    if augment is not None and (augment.padding or augment.hflip) and info.kind == "images":
        augments[info.input_column] = ImageAugment(crop=None, padding=augment.padding, hflip=augment.hflip)
    return TypedLoader(data, indices, batch_size, start_step, device, epoch=epoch, seed=seed, columns=columns,
                       decoders=decoders, augment=augments, num_workers=num_workers,
                       prefetch_batches=prefetch_batches, pool=pool)


def columns_of(batch) -> dict[str, torch.Tensor]:
    """A loader's batch as column name -> tensor (v1 batches have features and labels)."""
    if isinstance(batch, Batch):
        return {"features": batch.x, "label": batch.y}
    return batch


def model_batches(loader, info: DataInfo) -> Iterator[dict[str, torch.Tensor]]:
    for batch in loader:
        yield model_batch(info, columns_of(batch))
