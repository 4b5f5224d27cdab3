"""The loader over a split of any shard format, yielding what the tasks take: ``{"input": model
input, "target": targets}`` (``data.info.model_batch``).

Every split is a ``TypedSplit`` (v1 manifests are read as the columns ``features`` and ``label``),
so every split goes through ``TypedLoader``: it decodes JPEG columns and applies the seeded image
augmentation on its threads, and its sampling, resume mid-epoch and epoch chaining are the same
for every kind of data."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import numpy as np
import torch

from training_runtime.data.augment import ImageAugment
from training_runtime.data.decode import ImageDecoder
from training_runtime.data.info import DataInfo, model_batch
from training_runtime.data.loader import TypedLoader
from training_runtime.data.split import TypedSplit


def split_loader(data: TypedSplit, info: DataInfo, indices: np.ndarray, batch_size: int, start_step: int,
                 device: torch.device, *, epoch: int, seed: int, augment=None, num_workers: int = 1,
                 prefetch_batches: int = 4, pool: concurrent.futures.ThreadPoolExecutor | None = None
                 ) -> TypedLoader:
    """One epoch's batches of ``indices`` from ``start_step``: the model's input column and its
    target column. ``augment``: a config with ``padding`` and ``hflip`` (images only), or None."""
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


def model_batches(loader: TypedLoader, info: DataInfo) -> Iterator[dict[str, torch.Tensor]]:
    for batch in loader:
        yield model_batch(info, batch)
