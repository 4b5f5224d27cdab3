"""The built-in trainer's validations: when they are due, the best so far and its weights (keep_best),
early stopping, and a sweep's request to prune the trial."""

from __future__ import annotations

from typing import Any, Callable

import torch

from training_runtime.train.best import BestTracker
from training_runtime.train.context import TrainingContext


class Validator:
    """``save_best(step, metric, value)`` keeps the weights of a new best (collective)."""

    def __init__(self, ctx: TrainingContext, save_best: Callable[[int, str, float], None] | None = None):
        v = ctx.config.validation
        metric, mode = ctx.config.monitor()
        self.ctx, self.settings, self.save_best = ctx, v, save_best
        self.best = BestTracker(metric, mode, v.min_delta, v.patience)
        self.stopped_early = False
        self.pruned: str | None = None  # why a sweep stopped this trial (its pruner), else None
        self.pruned_at_step: int | None = None

    def due(self, step: int) -> bool:
        every = self.settings.every_steps
        due = step % every == 0 if every else step % self.ctx.steps_per_epoch == 0
        return due or step == self.ctx.total_steps

    def restore(self, history: dict[str, Any]) -> None:
        if history.get("validation"):
            self.best.restore(history["validation"])
        self.stopped_early = bool(history.get("stopped_early", False))

    def run(self, step: int, model: torch.nn.Module) -> None:
        """Collective: evaluate on the validation split, track the best, keep its weights; not a
        training step, so the hang watchdog waits."""
        with self.ctx.guards.paused():
            self._run(step, model)

    def _run(self, step: int, model: torch.nn.Module) -> None:
        ctx, best = self.ctx, self.best
        metrics = ctx.evaluate(model)
        model.train()
        improved = best.observe(step, metrics)
        if improved and self.settings.keep_best and self.save_best is not None:
            self.save_best(step, best.metric, best.best_value)
        scalars = {f"validation_{k}": v for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if ctx.is_main:
            ctx.reporter.custom({"kind": "validation", "step": step, **scalars, "best_step": best.best_step,
                                 "monitor": best.metric})
            ctx.reporter.info(f"validation at step {step}: {best.metric} {metrics[best.metric]:.4f} (best "
                              f"{best.best_value:.4f} at step {best.best_step})")
        if best.should_stop:
            self.stopped_early = True
            if ctx.is_main:
                ctx.reporter.info(f"early stopping at step {step}: no {best.metric} improvement in "
                                  f"{best.since_best} validations")
        # A sweep watching this trial reads the validation, and may answer with a stop request that
        # the next validation sees (training_runtime/train/trial_channel.py).
        ctx.report_validation(step, metrics)
        reason = ctx.prune_requested()
        if reason is not None:
            self.stopped_early, self.pruned, self.pruned_at_step = True, reason, step
            if ctx.is_main:
                ctx.reporter.info(f"stopped at step {step}: {reason}")

    def figures(self) -> dict[str, Any]:
        """metrics.json's validation figures."""
        b = self.best
        return {"monitor": b.metric, "monitor_mode": b.mode, "best_step": b.best_step, "best_value": b.best_value,
                "stopped_early": self.stopped_early, "validation_history": b.history,
                "pruned": self.pruned, "pruned_at_step": self.pruned_at_step,
                "weights_from_step": b.best_step if self.settings.keep_best else None}
