"""What the built-in trainer learns: each task brings its loss, its evaluation metrics and its
predictions, so the trainer, the evaluator, the model card and serving share one definition.

A task is built from the data's ``DataInfo`` and refuses data it cannot train on. The trainer
calls ``outputs, targets = task.forward(model, batch)`` and ``task.loss(outputs, targets)``;
the evaluator feeds the same pair to ``task.new_metrics(device).update``. Every metric state is
a torchmetrics state, so ``compute()`` inside a torch.distributed job reduces over the ranks: it
is a collective (every rank calls it) and every rank gets the global result.

Built-ins: ``classification``, ``regression``, ``multilabel`` and ``language_modeling``; a user
task is a ``Task`` subclass named by import path ``package.module:ClassName``. The torch-free
names and metric tables live in ``task_names`` (pipeline definitions read them).
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassConfusionMatrix, MultilabelExactMatch, MultilabelStatScores
from torchmetrics.functional.classification import binary_auroc
from torchmetrics.utilities import dim_zero_cat

from .data_info import DataInfo
from .task_names import BUILTIN_TASKS, DEFAULT_MONITOR, TASK_METRICS

_IMPORT_PATH_HINT = "an import path 'package.module:ClassName' naming a training_runtime.tasks.Task subclass"


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
        if BUILTIN_CLASSES.get(self.name) is not type(self):
            card["import_path"] = f"{type(self).__module__}:{type(self).__qualname__}"
        return card

    @classmethod
    def from_card(cls, card: Mapping, info: DataInfo) -> Task:
        """Rebuild the task for serving from its card and the data it was trained on."""
        _check_card_name(cls, card)
        return cls(info)


# ---------------------------------------------------------------- shared helpers
def _dtype_kind(dtype: str | None) -> str:
    """numpy's kind letter ('i', 'u', 'f', 'b') of a manifest dtype name; '?' when unknown."""
    if dtype is None:
        return "?"
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "f" if "float" in dtype else "?"


def _names(given: Sequence[str], n: int, what: str) -> tuple[str, ...]:
    if not given:
        return tuple(str(i) for i in range(n))
    if len(given) != n:
        raise ValueError(f"the data has {len(given)} {what} for {n} outputs; fix class_names / "
                         "target_names in the manifest")
    return tuple(given)


def _check_card_name(cls: type[Task], card: Mapping) -> None:
    if card.get("name") != cls.name:
        raise ValueError(f"model card task {card.get('name')!r} is not {cls.name!r}; rebuild it with "
                         "task_from_card, which picks the class the card names")


def _as_tensor(outputs: Tensor | np.ndarray) -> Tensor:
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


def _require_samples(n: int | float, task: str) -> None:
    if n == 0:
        raise ValueError(f"{task} metrics saw no samples: call update() with the split's batches "
                         "before compute() (on at least one rank)")


# ---------------------------------------------------------------- classification
class ClassificationTask(Task):
    """Single-label classification: int class labels [N], logits [N, C], cross-entropy."""

    name = "classification"
    metric_names = TASK_METRICS["classification"]
    monitor = DEFAULT_MONITOR["classification"]

    def __init__(self, info: DataInfo) -> None:
        super().__init__(info)
        if info.target_column is None or _dtype_kind(info.target_dtype) not in "iu" or info.target_shape != ():
            raise ValueError(
                f"classification needs one integer class label per sample; the data's target is "
                f"{_describe_target(info)}")
        if info.num_classes is None or info.num_classes < 2:
            raise ValueError(f"classification needs num_classes >= 2 in the manifest, got {info.num_classes}")
        self.num_classes = int(info.num_classes)
        self.class_names = _names(info.class_names, self.num_classes, "class_names")

    def num_outputs(self) -> int:
        return self.num_classes

    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return model(batch["input"]), batch["target"].long()

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs.float(), targets)

    def new_metrics(self, device: torch.device) -> TaskMetrics:
        return ClassificationMetrics(self, device)

    def predict(self, outputs: Tensor) -> dict[str, np.ndarray]:
        probs = torch.softmax(_as_tensor(outputs).float(), dim=-1)
        return {"class_index": probs.argmax(dim=-1).cpu().numpy().astype(np.int64),
                "probabilities": probs.cpu().numpy().astype(np.float32)}

    def card(self) -> dict:
        return {**super().card(), "num_classes": self.num_classes, "class_names": list(self.class_names)}


class ClassificationMetrics(TaskMetrics):
    """Accuracy, macro F1 and per-class recall all come from one confusion-matrix state, so they
    agree with each other. ``auroc`` is added for two classes when both occur in the split."""

    def __init__(self, task: ClassificationTask, device: torch.device) -> None:
        self.task = task
        metrics: dict[str, Metric] = {"loss": WeightedMean(),
                                      "confusion": MulticlassConfusionMatrix(task.num_classes)}
        if task.num_classes == 2:
            metrics["auroc"] = ExactBinaryAUROC()
        super().__init__(metrics, device)

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        logits, targets = outputs.detach().float(), targets.long()
        self.metrics["loss"].update(F.cross_entropy(logits, targets), weight=len(targets))
        self.metrics["confusion"].update(logits.argmax(dim=-1), targets)
        if "auroc" in self.metrics:
            self.metrics["auroc"].update(torch.softmax(logits, dim=-1)[:, 1], targets)

    def compute(self) -> dict[str, Any]:
        cm = self.metrics["confusion"].compute().cpu().double()  # rows: true class
        n = int(cm.sum())
        _require_samples(n, "classification")
        hits = cm.diagonal()
        support, predicted = cm.sum(dim=1), cm.sum(dim=0)
        # F1 = 2tp / (2tp + fp + fn); like scikit-learn, the macro mean skips classes that neither
        # occur nor are predicted in the split.
        seen = (support + predicted) > 0
        f1 = 2 * hits[seen] / (support + predicted)[seen]
        names = self.task.class_names
        out: dict[str, Any] = {
            "loss": float(self.metrics["loss"].compute()),
            "accuracy": float(hits.sum() / n),
            "macro_f1": float(f1.mean()),
            # Classes without samples in the split have no recall and are left out.
            "per_class_recall": {names[c]: float(hits[c] / support[c])
                                 for c in range(len(names)) if support[c] > 0},
            "confusion_matrix": cm.long().tolist(),
            "num_samples": n,
        }
        if "auroc" in self.metrics and bool((support > 0).all()):  # same on every rank: cm is synced
            out["auroc"] = float(self.metrics["auroc"].compute())
        return out


class ExactBinaryAUROC(Metric):
    """Exact AUROC over the whole split: keeps every score, like torchmetrics' BinaryAUROC with
    thresholds=None, but holds the 0/1 labels as float32 too. torchmetrics (1.9) stands in an
    empty float32 tensor for a list state on a rank that saw no samples, so BinaryAUROC's int64
    labels would meet float32 in the all-gather and break the collective."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        self.scores.append(scores.detach().float().flatten())
        self.labels.append(labels.detach().float().flatten())

    def compute(self) -> Tensor:
        return binary_auroc(dim_zero_cat(self.scores), dim_zero_cat(self.labels).long(), thresholds=None)


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
        if info.target_column is None or _dtype_kind(info.target_dtype) != "f" or len(info.target_shape) > 1:
            hint = "; class labels call for task 'classification'" if _dtype_kind(info.target_dtype) in "iu" else ""
            raise ValueError(f"regression needs a float target per sample (a scalar or a vector); the "
                             f"data's target is {_describe_target(info)}{hint}")
        self.scalar = info.target_shape == ()
        self.num_targets = 1 if self.scalar else int(info.target_shape[0])
        if self.num_targets < 1:
            raise ValueError(f"regression needs at least one target value, the target shape is {info.target_shape}")
        self.target_names = _names(info.class_names, self.num_targets, "target_names")
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
        values = self.denormalise(self._shaped(_as_tensor(outputs).double()))
        return {"value": values.cpu().numpy().astype(np.float32)}

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
        _check_card_name(cls, card)
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
        _require_samples(n, "regression")
        return {"loss": float(self.metrics["loss"].compute()),
                "mse": float(sums["mse"].mean()),
                "mae": float(sums["mae"].mean()),
                "r2": float(sums["r2"].mean()),
                "num_samples": n}


# ---------------------------------------------------------------- multi-label
class MultilabelTask(Task):
    """k independent 0/1 labels per sample: logits [N, k], binary cross-entropy; a label is on
    when its probability is above ``threshold`` (recorded in the card)."""

    name = "multilabel"
    metric_names = TASK_METRICS["multilabel"]
    monitor = DEFAULT_MONITOR["multilabel"]

    def __init__(self, info: DataInfo, threshold: float = 0.5) -> None:
        super().__init__(info)
        if info.target_column is None or _dtype_kind(info.target_dtype) not in "fiub" or len(info.target_shape) != 1:
            raise ValueError(f"multilabel needs a 0/1 vector of k labels per sample; the data's target "
                             f"is {_describe_target(info)}")
        self.num_labels = int(info.target_shape[0])
        if info.num_classes is not None and info.num_classes != self.num_labels:
            raise ValueError(f"the manifest's num_classes {info.num_classes} does not match its "
                             f"{self.num_labels}-label target vectors; fix num_classes")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"multilabel threshold {threshold} must be between 0 and 1")
        self.threshold = float(threshold)
        self.label_names = _names(info.class_names, self.num_labels, "class_names")

    def num_outputs(self) -> int:
        return self.num_labels

    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return model(batch["input"]), batch["target"].float()

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets.float())

    def new_metrics(self, device: torch.device) -> TaskMetrics:
        return MultilabelMetrics(self, device)

    def labels(self, probabilities: Tensor) -> Tensor:
        """The one place the threshold applies: predictions and metrics both use it."""
        return (probabilities > self.threshold).long()

    def predict(self, outputs: Tensor) -> dict[str, np.ndarray]:
        probs = torch.sigmoid(_as_tensor(outputs).float())
        return {"labels": self.labels(probs).cpu().numpy().astype(np.int64),
                "probabilities": probs.cpu().numpy().astype(np.float32)}

    def card(self) -> dict:
        return {**super().card(), "num_labels": self.num_labels, "label_names": list(self.label_names),
                "threshold": self.threshold}

    @classmethod
    def from_card(cls, card: Mapping, info: DataInfo) -> Task:
        _check_card_name(cls, card)
        return cls(info, threshold=float(card.get("threshold", 0.5)))


class MultilabelMetrics(TaskMetrics):
    """Exact-match (subset) accuracy, and micro, macro and per-label F1 from per-label counts.
    A label that neither occurs nor is predicted scores F1 0, as in scikit-learn."""

    def __init__(self, task: MultilabelTask, device: torch.device) -> None:
        self.task = task
        k = task.num_labels
        super().__init__({"loss": WeightedMean(),
                          "exact": MultilabelExactMatch(num_labels=k),
                          "counts": MultilabelStatScores(num_labels=k, average=None)}, device)

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        logits = outputs.detach().float()
        self.metrics["loss"].update(F.binary_cross_entropy_with_logits(logits, targets.float()),
                                    weight=targets.numel())
        # Hard 0/1 predictions: torchmetrics uses int predictions as they are.
        predicted, true = self.task.labels(torch.sigmoid(logits)), targets.long()
        self.metrics["exact"].update(predicted, true)
        self.metrics["counts"].update(predicted, true)

    def compute(self) -> dict[str, Any]:
        counts = self.metrics["counts"].compute().cpu().double()  # [k, (tp, fp, tn, fn, support)]
        tp, fp, tn, fn = counts[:, 0], counts[:, 1], counts[:, 2], counts[:, 3]
        n = int((tp + fp + tn + fn)[0])
        _require_samples(n, "multilabel")
        denominator = 2 * tp + fp + fn
        per_label = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
        micro_denominator = float(denominator.sum())
        return {"loss": float(self.metrics["loss"].compute()),
                "subset_accuracy": float(self.metrics["exact"].compute()),
                "micro_f1": float(2 * tp.sum() / micro_denominator) if micro_denominator else 0.0,
                "macro_f1": float(per_label.mean()),
                "per_label_f1": dict(zip(self.task.label_names, per_label.tolist())),
                "num_samples": n}


# ---------------------------------------------------------------- language modelling
class LanguageModelingTask(Task):
    """Next-token prediction on windows of L + 1 tokens: the model reads the first L and is scored
    on each of the L next tokens (logits [N, L, V])."""

    name = "language_modeling"
    metric_names = TASK_METRICS["language_modeling"]
    monitor = DEFAULT_MONITOR["language_modeling"]

    def __init__(self, info: DataInfo) -> None:
        super().__init__(info)
        if info.vocab_size is None or info.vocab_size < 2:
            raise ValueError(f"language_modeling needs the tokenizer's vocab_size (>= 2) in the manifest, "
                             f"got {info.vocab_size}; shard the text again with a tokenizer")
        if info.target_column is not None:
            raise ValueError(f"language_modeling learns from the tokens alone, but the data has a target "
                             f"column {info.target_column!r}: labelled text calls for task 'classification'")
        if _dtype_kind(info.input_dtype) not in "iu" or len(info.input_shape) != 1 or info.input_shape[0] < 2:
            raise ValueError(f"language_modeling needs windows of >= 2 integer tokens; the input column "
                             f"{info.input_column!r} holds {info.input_dtype} of shape {list(info.input_shape)}")
        self.vocab_size = int(info.vocab_size)
        self.context_length = int(info.input_shape[0]) - 1

    def num_outputs(self) -> int:
        return self.vocab_size

    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        tokens = batch["input"]
        outputs, targets = model(tokens[:, :-1]), tokens[:, 1:]
        if outputs.shape != (*targets.shape, self.vocab_size):
            raise ValueError(f"the model's output shape {tuple(outputs.shape)} is not [N, L, vocab_size] = "
                             f"{[*targets.shape, self.vocab_size]}; a language model outputs logits for "
                             "every position")
        return outputs, targets

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs.float().flatten(0, 1), targets.flatten())

    def new_metrics(self, device: torch.device) -> TaskMetrics:
        return LanguageModelingMetrics(self, device)

    def predict(self, outputs: Tensor) -> dict[str, np.ndarray]:
        logits = _as_tensor(outputs)
        if logits.ndim != 3:
            raise ValueError(f"language_modeling predicts from logits [N, L, V], got shape {tuple(logits.shape)}")
        probs = torch.softmax(logits[:, -1].float(), dim=-1)
        return {"next_token_probabilities": probs.cpu().numpy().astype(np.float32)}

    def card(self) -> dict:
        return {**super().card(), "vocab_size": self.vocab_size, "context_length": self.context_length,
                "pad_id": self.info.pad_id, "eos_id": self.info.eos_id}


class NextTokenTotals(Metric):
    """Summed next-token loss, correct top-1 guesses and token count over the whole split, so
    perplexity is exp(total loss / total tokens), not an average of per-batch perplexities."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("loss_sum", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("correct", default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, targets: Tensor) -> None:
        flat_logits, flat_targets = logits.flatten(0, -2).float(), targets.flatten()
        self.loss_sum += F.cross_entropy(flat_logits, flat_targets, reduction="sum").double()
        self.correct += (flat_logits.argmax(dim=-1) == flat_targets).sum()
        self.tokens += flat_targets.numel()

    def compute(self) -> dict[str, Tensor]:
        return {"loss_sum": self.loss_sum, "correct": self.correct, "tokens": self.tokens}


class LanguageModelingMetrics(TaskMetrics):
    def __init__(self, task: LanguageModelingTask, device: torch.device) -> None:
        super().__init__({"totals": NextTokenTotals()}, device)

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        self.metrics["totals"].update(outputs.detach(), targets)

    def compute(self) -> dict[str, Any]:
        totals = self.metrics["totals"].compute()
        tokens = int(totals["tokens"])
        _require_samples(tokens, "language_modeling")
        loss = float(totals["loss_sum"]) / tokens
        return {"loss": loss,
                "perplexity": math.inf if loss > 700 else math.exp(loss),  # exp overflows past ~709; NaN stays NaN
                "accuracy": int(totals["correct"]) / tokens,
                "num_tokens": tokens}


# ---------------------------------------------------------------- lookup
BUILTIN_CLASSES: dict[str, type[Task]] = {
    c.name: c for c in (ClassificationTask, LanguageModelingTask, MultilabelTask, RegressionTask)}
assert tuple(sorted(BUILTIN_CLASSES)) == BUILTIN_TASKS, "task_names.BUILTIN_TASKS must list BUILTIN_CLASSES"


def _describe_target(info: DataInfo) -> str:
    if info.target_column is None:
        return "absent (token windows: task 'language_modeling')"
    return f"column {info.target_column!r} of {info.target_dtype} with shape {list(info.target_shape)}"


def task_class(name: str) -> type[Task]:
    """The class a ``task`` setting names: a built-in name or 'package.module:ClassName'."""
    if name in BUILTIN_CLASSES:
        return BUILTIN_CLASSES[name]
    if ":" not in name:
        raise ValueError(f"task {name!r} is unknown; use one of {list(BUILTIN_TASKS)} or {_IMPORT_PATH_HINT}")
    module, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"task {name!r} cannot be imported ({e}); check the import path and that its "
                         "package is installed where training runs") from e
    if not (isinstance(obj, type) and issubclass(obj, Task)):
        what = f"class {obj.__qualname__}" if isinstance(obj, type) else type(obj).__name__
        raise ValueError(f"task {name!r} is a {what}, not a Task subclass; it must name "
                         f"{_IMPORT_PATH_HINT}")
    if inspect.isabstract(obj):
        missing = sorted(obj.__abstractmethods__)
        raise ValueError(f"task {name!r} leaves Task methods {missing} unimplemented; define them")
    _check_class_attributes(obj, name)
    return obj


def _check_class_attributes(cls: type[Task], ref: str) -> None:
    metric_names, monitor = getattr(cls, "metric_names", None), getattr(cls, "monitor", None)
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise ValueError(f"task {ref!r}: {cls.__qualname__}.name must be a non-empty string")
    if not (isinstance(metric_names, tuple) and metric_names and metric_names[0] == "loss"
            and all(isinstance(m, str) for m in metric_names)):
        raise ValueError(f"task {ref!r}: {cls.__qualname__}.metric_names must be a tuple of metric names "
                         f"starting with 'loss', got {metric_names!r}")
    if not (isinstance(monitor, tuple) and len(monitor) == 2 and monitor[0] in metric_names
            and monitor[1] in ("min", "max")):
        raise ValueError(f"task {ref!r}: {cls.__qualname__}.monitor must be (one of {list(metric_names)}, "
                         f"'min' or 'max'), got {monitor!r}")


def resolve_task(name: str, info: DataInfo) -> Task:
    """The task a run's ``task`` setting names, built for its data. ValueError naming ``task``,
    what is wrong and the fix when the name does not resolve or the data does not fit."""
    cls = task_class(name)
    try:
        return cls(info)
    except ValueError as e:
        fix = (f"set task to {info.task!r}, which the data was prepared for" if info.task != name
               else "prepare the data again with what is missing")
        raise ValueError(f"task {name!r} does not fit the data: {e}; {fix}") from e


def task_from_card(card: Mapping, info: DataInfo) -> Task:
    """Serving's task: the class a model card's task section names, rebuilt from that card."""
    ref = card.get("import_path") or card.get("name")
    if not isinstance(ref, str):
        raise ValueError(f"model card task section {dict(card)} names no task; it needs 'name'")
    return task_class(ref).from_card(card, info)
