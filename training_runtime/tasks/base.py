"""The contract of a task: what the built-in trainer learns. Each task brings its loss, its evaluation
metrics and its predictions, so the trainer, the evaluator, the model card and serving share one
definition.

A task is built from the data's ``DataInfo`` and refuses data it cannot train on. The trainer
calls ``outputs, targets = task.forward(model, batch)`` and ``task.loss(outputs, targets)``;
the evaluator feeds the same pair to ``task.new_metrics(device).update``. Every metric state is
a torchmetrics state, so ``compute()`` inside a torch.distributed job reduces over the ranks: it
is a collective (every rank calls it) and every rank gets the global result.

A user task is a ``Task`` subclass named by import path ``package.module:ClassName``; the
built-ins sit beside this module, and ``registry`` resolves names to classes. The torch-free
names and metric tables live in ``names`` (pipeline definitions read them).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from training_runtime.data.info import DataInfo
from training_runtime.tasks.names import BUILTIN_TASKS

IMPORT_PATH_HINT = "an import path 'package.module:ClassName' naming a training_runtime.tasks.base.Task subclass"


# ---------------------------------------------------------------- the contract
class TaskMetrics(abc.ABC):
    """One pass of evaluation over a split. ``update`` takes what ``Task.forward`` returned;
    ``compute`` returns plain floats for the task's ``metric_names`` plus extras (lists, dicts).
    ``self.metrics`` holds the torchmetrics objects, so ``reset`` and device placement are shared."""

    def __init__(self, metrics: Mapping[str, Metric], device: torch.device) -> None:
        self.metrics: dict[str, Metric] = {name: m.to(device) for name, m in metrics.items()}

    @abc.abstractmethod
    def update(self, outputs: Tensor, targets: Tensor) -> None: ...

    @abc.abstractmethod
    def compute(self) -> dict[str, Any]: ...

    def reset(self) -> None:
        for m in self.metrics.values():
            m.reset()


class Task(abc.ABC):
    """A learning problem over one kind of data. ``metric_names`` lists the scalars every
    ``compute()`` returns; a quality gate or ``monitor`` may name only those (built-ins: see
    ``task_names``). ``forward`` and ``loss`` run inside the training step, so they stay on the
    device and never synchronise with the host."""

    name: ClassVar[str]
    metric_names: ClassVar[tuple[str, ...]]  # scalars compute() always returns, "loss" first
    monitor: ClassVar[tuple[str, str]]  # (metric, "min" or "max") for early stopping / keep-best

    def __init__(self, info: DataInfo) -> None:
        """Subclasses raise ValueError naming the problem when ``info`` does not fit the task."""
        self.info = info

    @abc.abstractmethod
    def num_outputs(self) -> int:
        """What the model factory gets as ``num_classes``: the width of the model's output."""

    @abc.abstractmethod
    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(outputs, targets) for a ``data_info.model_batch`` batch."""

    @abc.abstractmethod
    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Scalar float32 mean loss (outputs may be bf16 under autocast)."""

    @abc.abstractmethod
    def new_metrics(self, device: torch.device) -> TaskMetrics: ...

    @abc.abstractmethod
    def predict(self, outputs: Tensor) -> dict[str, np.ndarray]:
        """Serving's answer for a batch of model outputs (a tensor, or a numpy array from ONNX)."""

    def card(self) -> dict:
        """The task section of a model card: its name and whatever ``predict`` needs. A user task's
        card also records its import path, so ``task_from_card`` finds the class again."""
        card: dict[str, Any] = {"name": self.name}
        # Built-in classes live in this package; a subclass elsewhere (even one keeping a built-in's
        # name) is a user task and must be found again by its import path.
        if self.name not in BUILTIN_TASKS or not type(self).__module__.startswith("training_runtime.tasks."):
            card["import_path"] = f"{type(self).__module__}:{type(self).__qualname__}"
        return card

    @classmethod
    def from_card(cls, card: Mapping, info: DataInfo) -> Task:
        """Rebuild the task for serving from its card and the data it was trained on."""
        check_card_name(cls, card)
        return cls(info)


# ---------------------------------------------------------------- shared helpers
def dtype_kind(dtype: str | None) -> str:
    """numpy's kind letter ('i', 'u', 'f', 'b') of a manifest dtype name; '?' when unknown."""
    if dtype is None:
        return "?"
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "f" if "float" in dtype else "?"


def output_names(given: Sequence[str], n: int, what: str) -> tuple[str, ...]:
    if not given:
        return tuple(str(i) for i in range(n))
    if len(given) != n:
        raise ValueError(f"the data has {len(given)} {what} for {n} outputs; fix class_names / "
                         "target_names in the manifest")
    return tuple(given)


def check_card_name(cls: type[Task], card: Mapping) -> None:
    if card.get("name") != cls.name:
        raise ValueError(f"model card task {card.get('name')!r} is not {cls.name!r}; rebuild it with "
                         "task_from_card, which picks the class the card names")


def as_tensor(outputs: Tensor | np.ndarray) -> Tensor:
    return torch.as_tensor(outputs).detach()


class WeightedMean(Metric):
    """A running mean of batch means weighted by their sizes, in float64, that keeps NaN (a
    diverged model must not look fine). torchmetrics' MeanMetric drops NaN, or with
    ``nan_strategy="disable"`` drops the weights as well (torchmetrics 1.9)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("weighted_sum", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: Tensor, weight: int | float) -> None:
        self.weighted_sum += value.detach().double() * weight
        self.weight += weight

    def compute(self) -> Tensor:
        return self.weighted_sum / self.weight


def require_samples(n: int | float, task: str) -> None:
    if n == 0:
        raise ValueError(f"{task} metrics saw no samples: call update() with the split's batches "
                         "before compute() (on at least one rank)")


def describe_target(info: DataInfo) -> str:
    if info.target_column is None:
        return "absent (token windows: task 'language_modeling')"
    return f"column {info.target_column!r} of {info.target_dtype} with shape {list(info.target_shape)}"
