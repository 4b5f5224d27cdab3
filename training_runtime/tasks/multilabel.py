"""Multi-label classification: a 0/1 target per label, one logit per label, binary cross-entropy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MultilabelExactMatch, MultilabelStatScores

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


# ---------------------------------------------------------------- multi-label
class MultilabelTask(Task):
    """k independent 0/1 labels per sample: logits [N, k], binary cross-entropy; a label is on
    when its probability is above ``threshold`` (recorded in the card)."""

    name = "multilabel"
    metric_names = TASK_METRICS["multilabel"]
    monitor = DEFAULT_MONITOR["multilabel"]

    def __init__(self, info: DataInfo, threshold: float = 0.5) -> None:
        super().__init__(info)
        if info.target_column is None or dtype_kind(info.target_dtype) not in "fiub" or len(info.target_shape) != 1:
            raise ValueError(f"multilabel needs a 0/1 vector of k labels per sample; the data's target "
                             f"is {describe_target(info)}")
        self.num_labels = int(info.target_shape[0])
        if info.num_classes is not None and info.num_classes != self.num_labels:
            raise ValueError(f"the manifest's num_classes {info.num_classes} does not match its "
                             f"{self.num_labels}-label target vectors; fix num_classes")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"multilabel threshold {threshold} must be between 0 and 1")
        self.threshold = float(threshold)
        self.label_names = output_names(info.class_names, self.num_labels, "class_names")

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
        probs = torch.sigmoid(as_tensor(outputs).float())
        return {"labels": self.labels(probs).cpu().numpy().astype(np.int64),
                "probabilities": probs.cpu().numpy().astype(np.float32)}

    def card(self) -> dict:
        return {**super().card(), "num_labels": self.num_labels, "label_names": list(self.label_names),
                "threshold": self.threshold}

    @classmethod
    def from_card(cls, card: Mapping, info: DataInfo) -> Task:
        check_card_name(cls, card)
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
        require_samples(n, "multilabel")
        denominator = 2 * tp + fp + fn
        per_label = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
        micro_denominator = float(denominator.sum())
        return {"loss": float(self.metrics["loss"].compute()),
                "subset_accuracy": float(self.metrics["exact"].compute()),
                "micro_f1": float(2 * tp.sum() / micro_denominator) if micro_denominator else 0.0,
                "macro_f1": float(per_label.mean()),
                "per_label_f1": dict(zip(self.task.label_names, per_label.tolist())),
                "num_samples": n}
