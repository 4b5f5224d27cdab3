"""Evaluating a model on a split (during training, on every rank; afterwards, in one process), and
the record of validations that early stopping and keep_best decide from."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from training_runtime.batches import model_batches, split_loader
from training_runtime.data_info import DataInfo


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


@dataclass
class BestTracker:
    """Validations so far and the best one by ``metric`` (``mode`` 'min' or 'max'). An improvement
    must beat the best by more than ``min_delta``; after ``patience`` validations without one
    (None: never) training should stop. Its state travels in checkpoints, so a resumed run decides
    as the uninterrupted one would."""

    metric: str
    mode: str
    min_delta: float = 0.0
    patience: int | None = None
    best_value: float | None = None
    best_step: int | None = None
    since_best: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        if self.mode == "min":
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def observe(self, step: int, metrics: dict[str, Any]) -> bool:
        """Record a validation; True when it is the new best."""
        if self.metric not in metrics:
            raise KeyError(f"validation metric {self.metric!r} is not among {sorted(metrics)}")
        value = float(metrics[self.metric])
        self.history.append({"step": step, **{k: v for k, v in metrics.items() if _is_scalar(v)}})
        if self.improves(value):
            self.best_value, self.best_step, self.since_best = value, step, 0
            return True
        self.since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.since_best >= self.patience

    def state(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_step": self.best_step, "since_best": self.since_best,
                "history": [dict(h) for h in self.history]}

    def restore(self, state: dict[str, Any]) -> None:
        self.best_value, self.best_step = state["best_value"], state["best_step"]
        self.since_best, self.history = state["since_best"], [dict(h) for h in state["history"]]


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
