"""Evaluating a model on a split with its task's metrics: during training on every rank (the metric
states reduce over the ranks), afterwards in one process."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from training_runtime.data.batches import model_batches, split_loader
from training_runtime.data.info import DataInfo


@torch.no_grad()
def evaluate_split(model: nn.Module, task, info: DataInfo, data, *, rank: int = 0, world_size: int = 1,
                   batch_size: int = 256, device: torch.device | None = None, bf16: bool = False,
                   num_workers: int = 1) -> dict[str, Any]:
    """The task's metrics of ``model`` on the whole split ``data``.

    Rank r reads samples r, r + world_size, ...; every rank runs the same number of batches (a
    sharded model's forward is collective), padded with repeats of its last sample that are left
    out of the metrics. The task's metrics are torchmetrics states, so ``compute`` sums them over
    the ranks: every rank returns the figures of the whole split."""
    device = device or torch.device("cpu")
    n = data.num_samples
    mine = np.arange(rank, n, world_size, dtype=np.int64)
    per_rank = math.ceil(n / world_size)
    fill = mine[-1] if len(mine) else 0
    indices = np.concatenate([mine, np.full(per_rank - len(mine), fill, dtype=np.int64)])
    loader = split_loader(data, info, indices, batch_size, 0, device, epoch=0, seed=0, augment=None,
                          num_workers=num_workers, prefetch_batches=2)
    metrics = task.new_metrics(device)
    was_training = model.training
    model.eval()
    seen = 0
    try:
        for batch in model_batches(loader, info):
            autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext())
            with autocast:
                outputs, targets = task.forward(model, batch)
            rows = len(outputs)
            keep = max(0, min(rows, len(mine) - seen))  # the padding comes last
            if keep:
                metrics.update(outputs[:keep].float(), targets[:keep])
            seen += rows
    finally:
        loader.close()
        model.train(was_training)
    result = metrics.compute()
    result["num_samples"] = n
    return result
