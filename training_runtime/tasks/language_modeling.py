"""Language modelling: next-token cross-entropy over token windows; loss and perplexity per token."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from training_runtime.data.info import DataInfo
from training_runtime.tasks.base import Task, TaskMetrics, as_tensor, dtype_kind, require_samples
from training_runtime.tasks.names import DEFAULT_MONITOR, TASK_METRICS


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
        if dtype_kind(info.input_dtype) not in "iu" or len(info.input_shape) != 1 or info.input_shape[0] < 2:
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
        logits = as_tensor(outputs)
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
        require_samples(tokens, "language_modeling")
        loss = float(totals["loss_sum"]) / tokens
        return {"loss": loss,
                "perplexity": math.inf if loss > 700 else math.exp(loss),  # exp overflows past ~709; NaN stays NaN
                "accuracy": int(totals["correct"]) / tokens,
                "num_tokens": tokens}
