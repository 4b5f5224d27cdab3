"""The record of validations that early stopping and keep_best decide from."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


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
