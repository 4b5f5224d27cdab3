"""Regression on float targets, trained on normalised targets and reported in source units."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from training_runtime.data.info import DataInfo
from training_runtime.tasks.base import (
    Task,
    TaskMetrics,
    WeightedMean,
    as_tensor,
    check_card_name,
    describe_target,
    dtype_kind,
    output_names,
    require_samples,
)
from training_runtime.tasks.names import DEFAULT_MONITOR, TASK_METRICS


# ---------------------------------------------------------------- regression
class RegressionTask(Task):
    """Float targets [N] or [N, k]. The model learns targets normalised with the training split's
    ``target_normalisation`` (identity when None): ``forward`` returns normalised targets and
    ``loss`` is the MSE in those units; metrics and predictions are in the original units."""

    name = "regression"
    metric_names = TASK_METRICS["regression"]
    monitor = DEFAULT_MONITOR["regression"]

    def __init__(self, info: DataInfo) -> None:
        super().__init__(info)
        if info.target_column is None or dtype_kind(info.target_dtype) != "f" or len(info.target_shape) > 1:
            hint = "; class labels call for task 'classification'" if dtype_kind(info.target_dtype) in "iu" else ""
            raise ValueError(f"regression needs a float target per sample (a scalar or a vector); the "
                             f"data's target is {describe_target(info)}{hint}")
        self.scalar = info.target_shape == ()
        self.num_targets = 1 if self.scalar else int(info.target_shape[0])
        if self.num_targets < 1:
            raise ValueError(f"regression needs at least one target value, the target shape is {info.target_shape}")
        self.target_names = output_names(info.class_names, self.num_targets, "target_names")
        self.mean, self.std = _target_statistics(info.target_normalisation, self.num_targets)
        self._on_device: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def statistics(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """(mean, std) as tensors of ``like``'s device and dtype: [k], or scalars for scalar targets."""
        key = (like.device, like.dtype)
        if key not in self._on_device:
            mean, std = (torch.tensor(a, dtype=like.dtype, device=like.device) for a in (self.mean, self.std))
            self._on_device[key] = (mean[0], std[0]) if self.scalar else (mean, std)
        return self._on_device[key]

    def normalise(self, values: Tensor) -> Tensor:
        mean, std = self.statistics(values)
        return (values - mean) / std

    def denormalise(self, values: Tensor) -> Tensor:
        mean, std = self.statistics(values)
        return values * std + mean

    def num_outputs(self) -> int:
        return self.num_targets

    def _shaped(self, outputs: Tensor) -> Tensor:
        if self.scalar and outputs.ndim == 2 and outputs.shape[1] == 1:
            return outputs.squeeze(1)
        return outputs

    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        outputs = self._shaped(model(batch["input"]))
        targets = self.normalise(batch["target"].float())
        if outputs.shape != targets.shape:  # MSE would broadcast [N] against [N, 1] silently
            raise ValueError(f"the model's output shape {tuple(outputs.shape)} does not match the "
                             f"regression targets' {tuple(targets.shape)}; the model must output "
                             f"num_classes={self.num_targets} value(s) per sample")
        return outputs, targets

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.mse_loss(outputs.float(), targets.float())

    def new_metrics(self, device: torch.device) -> TaskMetrics:
        return RegressionMetrics(self, device)

    def predict(self, outputs: Tensor) -> dict[str, np.ndarray]:
        values = self.denormalise(self._shaped(as_tensor(outputs).double()))
        # float64, as the card's postprocessing states: float32 would round a value in the hundreds
        # by up to 1.5e-5 (its spacing there is 3e-5), more than a server following the card differs.
        return {"value": values.cpu().numpy()}

    def card(self) -> dict:
        return {**super().card(), "num_outputs": self.num_targets,
                "target_shape": list(self.info.target_shape), "target_names": list(self.target_names),
                "target_normalisation": self._normalisation_for_card()}

    def _normalisation_for_card(self) -> dict | None:
        if self.info.target_normalisation is None:
            return None
        if self.scalar:
            return {"mean": float(self.mean[0]), "std": float(self.std[0])}
        return {"mean": [float(v) for v in self.mean], "std": [float(v) for v in self.std]}

    @classmethod
    def from_card(cls, card: Mapping, info: DataInfo) -> Task:
        """The card's normalisation is the one the weights were trained with: it wins over info's."""
        check_card_name(cls, card)
        return cls(dataclasses.replace(info, target_normalisation=card.get("target_normalisation")))


def _target_statistics(norm: Mapping | None, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 (mean, std) of k targets from ``{"mean": float or list, "std": ...}``; None: identity."""
    if norm is None:
        return np.zeros(k), np.ones(k)
    stats = []
    for key in ("mean", "std"):
        if key not in norm:
            raise ValueError(f"target_normalisation {dict(norm)} has no {key!r}; it needs "
                             "{'mean': ..., 'std': ...} from the training split (or null for none)")
        values = np.atleast_1d(np.asarray(norm[key], dtype=np.float64))
        if values.ndim != 1 or len(values) not in (1, k):
            raise ValueError(f"target_normalisation {key} {norm[key]!r} must be a number or a list of "
                             f"{k} numbers, one per target value")
        stats.append(np.broadcast_to(values, (k,)).copy())
    mean, std = stats
    if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
        raise ValueError(f"target_normalisation {dict(norm)} needs finite means and stds > 0; a constant "
                         "target has nothing to learn: drop it or shard the data again")
    return mean, std


class RegressionSums(Metric):
    """Per-target sums, each state of a fixed shape [k] in float64: squared and absolute errors in
    original units, and for R2 the normalised targets' sums and squared errors. R2 is the same
    number in either unit (a per-target affine map leaves it unchanged), and normalised targets
    spare it the cancellation sum(y^2) - sum(y)^2 / n suffers on targets far from 0.

    Fixed shapes matter: torchmetrics' R2Score grows its states from scalars to [k] on the first
    update, so a rank without samples would all-gather mismatched shapes and stall the job."""

    full_state_update = False

    def __init__(self, num_targets: int) -> None:
        super().__init__()
        for state in ("count", "squared_error", "absolute_error", "norm_sum", "norm_squares", "norm_squared_error"):
            self.add_state(state, default=torch.zeros(num_targets, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: Tensor, true: Tensor, norm_pred: Tensor, norm_true: Tensor) -> None:
        """[N, k] values in original and in normalised units."""
        self.count += len(true)
        self.squared_error += ((pred - true) ** 2).sum(dim=0)
        self.absolute_error += (pred - true).abs().sum(dim=0)
        self.norm_sum += norm_true.sum(dim=0)
        self.norm_squares += (norm_true ** 2).sum(dim=0)
        self.norm_squared_error += ((norm_pred - norm_true) ** 2).sum(dim=0)

    def compute(self) -> dict[str, Tensor]:
        """Per-target mse, mae and r2 (r2 as scikit-learn scores a constant target: 1 when it is
        predicted exactly, else 0)."""
        n = self.count.clamp(min=1)
        spread = self.norm_squares - self.norm_sum ** 2 / n
        r2 = torch.where(spread > 0, 1 - self.norm_squared_error / spread.clamp(min=1e-300),
                         (self.norm_squared_error == 0).double())
        return {"count": self.count, "mse": self.squared_error / n, "mae": self.absolute_error / n, "r2": r2}


class RegressionMetrics(TaskMetrics):
    """MSE, MAE and R2 in original target units, each the mean over target values as in
    scikit-learn; ``loss`` is the training loss, in normalised units."""

    def __init__(self, task: RegressionTask, device: torch.device) -> None:
        self.task = task
        super().__init__({"loss": WeightedMean(), "sums": RegressionSums(task.num_targets)}, device)

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        outputs, targets = outputs.detach().double(), targets.detach().double()
        self.metrics["loss"].update(F.mse_loss(outputs, targets), weight=targets.numel())
        k = self.task.num_targets
        norm_pred, norm_true = outputs.reshape(-1, k), targets.reshape(-1, k)
        pred, true = self.task.denormalise(outputs).reshape(-1, k), self.task.denormalise(targets).reshape(-1, k)
        self.metrics["sums"].update(pred, true, norm_pred, norm_true)

    def compute(self) -> dict[str, Any]:
        sums = self.metrics["sums"].compute()  # torchmetrics squeezes [1] states of a scalar target
        n = int(sums["count"].reshape(-1)[0])
        require_samples(n, "regression")
        return {"loss": float(self.metrics["loss"].compute()),
                "mse": float(sums["mse"].mean()),
                "mae": float(sums["mae"].mean()),
                "r2": float(sums["r2"].mean()),
                "num_samples": n}
