"""A stand-in for a training launch in sweep tests: it writes validations through the trial channel
as the runtime does, honours a stop request at its next validation, and returns metrics.json's
fields. The objective depends only on the trial's parameters, so the best trial is known."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from training_runtime.train.trial_channel import append_report, stop_reason

VALIDATIONS, STEPS_PER_VALIDATION = 8, 10


def objective(params: dict, k: int) -> float:
    """Validation loss after validation k: far from lr 0.01 is worse; it improves with k."""
    import math

    return abs(math.log10(params["train.lr"]) + 2) + 1.0 / k


class FakeLaunches:
    def __init__(self, delay_s: float = 0.05, crash: dict[int, int] | None = None, hang_when_pruned: bool = False):
        self.delay_s = delay_s
        self.crash = dict(crash or {})  # trial number -> times its launch raises first
        # A pruned trial's launch writes its outputs, then never returns: the run worker is killed
        # after the training ended and before the sweep told the study (the user's case, issue 45).
        self.hang_when_pruned = hang_when_pruned
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.launched: list[int] = []
        self.validations: dict[int, int] = {}

    def __call__(self, plan) -> dict:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.launched.append(plan.number)
        try:
            if self.crash.get(plan.number, 0) > 0:
                self.crash[plan.number] -= 1
                raise RuntimeError(f"worker of trial {plan.number} died")
            best, pruned_at = None, None
            for k in range(1, VALIDATIONS + 1):
                time.sleep(self.delay_s)
                step = k * STEPS_PER_VALIDATION
                value = objective(plan.params, k)
                best = value if best is None else min(best, value)
                append_report(plan.report_file, {"step": step, "loss": value, "accuracy": 0.5})
                self.validations[plan.number] = k
                if stop_reason(plan.stop_file):  # the runtime checks right after reporting
                    pruned_at = step
                    break
            metrics = {"monitor": "loss", "best_value": best, "steps": step, "pruned_at_step": pruned_at,
                       "pruned": "yes" if pruned_at else None}
            plan.metrics_file.parent.mkdir(parents=True, exist_ok=True)  # where the runtime writes it
            plan.metrics_file.write_text(json.dumps(metrics))
            while self.hang_when_pruned and pruned_at:
                time.sleep(1)
            return metrics
        finally:
            with self.lock:
                self.running -= 1
