"""User tasks loaded by import path in the tests (``tests.runtime.user_task:L1Regression``)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from training_runtime.tasks.base import Task, TaskMetrics


class L1Regression(Task):
    """Scalar float targets learnt with the mean absolute error, in original units."""

    name = "l1_regression"
    metric_names = ("loss", "mae")
    monitor = ("mae", "min")

    def __init__(self, info):
        super().__init__(info)
        if info.target_dtype != "float32" or info.target_shape != ():
            raise ValueError(f"l1_regression needs a float32 scalar target, got {info.target_dtype} "
                             f"{list(info.target_shape)}")

    def num_outputs(self):
        return 1

    def forward(self, model, batch):
        return model(batch["input"]).squeeze(1), batch["target"].float()

    def loss(self, outputs, targets):
        return F.l1_loss(outputs.float(), targets)

    def new_metrics(self, device):
        return L1Metrics({"mae": MeanMetric()}, device)

    def predict(self, outputs):
        return {"value": torch.as_tensor(outputs).detach().reshape(-1).cpu().numpy().astype(np.float32)}


class L1Metrics(TaskMetrics):
    def update(self, outputs, targets):
        self.metrics["mae"].update((outputs.detach().float() - targets).abs())

    def compute(self):
        mae = float(self.metrics["mae"].compute())
        return {"loss": mae, "mae": mae}


class NotATask:
    """A class that does not subclass Task."""


class LossNotFirst(L1Regression):
    metric_names = ("mae", "loss")


class Unfinished(Task):
    """Leaves the abstract methods undefined."""

    name = "unfinished"
    metric_names = ("loss",)
    monitor = ("loss", "min")
