"""The cellar team's task (docs/own-training-code.md, "Your own Task", shows this file whole):
classification trained with label smoothing, with its own metrics and predictions."""

import torch
import torch.nn.functional as F
from torchmetrics import SumMetric
from torchmetrics.classification import MulticlassAccuracy

from training_runtime.tasks.base import Task, TaskMetrics, WeightedMean


class SmoothedMetrics(TaskMetrics):
    def update(self, outputs, targets):
        self.metrics["loss"].update(F.cross_entropy(outputs.float(), targets), weight=len(targets))
        self.metrics["accuracy"].update(outputs.argmax(dim=-1), targets)
        self.metrics["num_samples"].update(len(targets))

    def compute(self):  # collective under torchrun: every rank gets the whole split's figures
        out = {name: float(metric.compute()) for name, metric in self.metrics.items()}
        return {**out, "num_samples": int(out["num_samples"])}


class SmoothedClassification(Task):
    """Single-label classification, trained with 10% of each target spread over the other classes."""

    name, metric_names, monitor = "classification", ("loss", "accuracy"), ("accuracy", "max")

    def num_outputs(self):
        return self.info.num_classes

    def forward(self, model, batch):
        return model(batch["input"]), batch["target"].long()

    def loss(self, outputs, targets):
        return F.cross_entropy(outputs.float(), targets, label_smoothing=0.1)

    def new_metrics(self, device):
        return SmoothedMetrics({"loss": WeightedMean(), "num_samples": SumMetric(),
                                "accuracy": MulticlassAccuracy(self.num_outputs(), average="micro")}, device)

    def predict(self, outputs):
        probabilities = torch.softmax(torch.as_tensor(outputs).float(), dim=-1)
        return {"class_index": probabilities.argmax(dim=-1).numpy(), "probabilities": probabilities.numpy()}
