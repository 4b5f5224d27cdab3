"""Single-label classification: int class labels, logits, cross-entropy; accuracy, macro F1 and (for
two classes) an exact AUROC."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassConfusionMatrix
from torchmetrics.functional.classification import binary_auroc
from torchmetrics.utilities import dim_zero_cat

from training_runtime.data.info import DataInfo
from training_runtime.tasks.base import (
    Task,
    TaskMetrics,
    WeightedMean,
    as_tensor,
    describe_target,
    dtype_kind,
    output_names,
    require_samples,
)
from training_runtime.tasks.names import DEFAULT_MONITOR, TASK_METRICS


# ---------------------------------------------------------------- classification
class ClassificationTask(Task):
    """Single-label classification: int class labels [N], logits [N, C], cross-entropy."""

    name = "classification"
    metric_names = TASK_METRICS["classification"]
    monitor = DEFAULT_MONITOR["classification"]

    def __init__(self, info: DataInfo) -> None:
        super().__init__(info)
        if info.target_column is None or dtype_kind(info.target_dtype) not in "iu" or info.target_shape != ():
            raise ValueError(
                f"classification needs one integer class label per sample; the data's target is "
                f"{describe_target(info)}")
        if info.num_classes is None or info.num_classes < 2:
            raise ValueError(f"classification needs num_classes >= 2 in the manifest, got {info.num_classes}")
        self.num_classes = int(info.num_classes)
        self.class_names = output_names(info.class_names, self.num_classes, "class_names")

    def num_outputs(self) -> int:
        return self.num_classes

    def forward(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return model(batch["input"]), batch["target"].long()

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs.float(), targets)

    def new_metrics(self, device: torch.device) -> TaskMetrics:
        return ClassificationMetrics(self, device)

    def predict(self, outputs: Tensor) -> dict[str, np.ndarray]:
        probs = torch.softmax(as_tensor(outputs).float(), dim=-1)
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
        require_samples(n, "classification")
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
