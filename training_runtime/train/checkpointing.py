"""What the built-in trainer saves and resumes: model and optimizer (full or sharded), schedule,
data position, history, totals and validation state, and the best validation's weights."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from training_runtime.checkpoint import full as ckpt
from training_runtime.checkpoint import sharded as sharded_checkpoint
from training_runtime.checkpoint.weights import StoredWeights, stored_weights, write_weights_checkpoint
from training_runtime.config import ConfigError
from training_runtime.distributed.fsdp import full_optimizer_state, is_sharded, load_full_state
from training_runtime.distributed.process_group import all_gather_object
from training_runtime.serve.card import SAFETENSORS_METADATA, WEIGHTS_FILE
from training_runtime.train.context import TrainingContext
from training_runtime.train.reporting import IntervalReporter

if TYPE_CHECKING:
    from training_runtime.train.validation import Validator


class TrainerCheckpoints:
    def __init__(self, ctx: TrainingContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 reporter: IntervalReporter, validator: Validator | None):
        self.ctx, self.cfg = ctx, ctx.config
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.reporter, self.validator = reporter, validator

    # ------------------------------------------------------------ the run's checkpoints
    def save(self, step: int) -> None:
        """Collective: checkpoint ``step`` with every interval's history and totals (the caller
        has read the pending figures)."""
        ctx = self.ctx
        own = {"epoch": step // ctx.steps_per_epoch, "step_in_epoch": step % ctx.steps_per_epoch,
               "scheduler": self.scheduler.state_dict(), "history": self._history()}
        if self.cfg.checkpoint.resolved_format(self.cfg.train.sharding) == "sharded":
            self._save_sharded(step, own)
            return
        model_sd = ctx.full_state(self.model)
        optim_sd = full_optimizer_state(self.model, self.optimizer, self.cfg.train.sharding)
        ctx.save_checkpoint(step, {**own, "model": model_sd, "optimizer": optim_sd}, self.optimizer)

    def _save_sharded(self, step: int, own: dict[str, Any]) -> None:
        """Collective: every rank writes its own shards; rank 0 adds the trainer's state with the
        same keys as a full checkpoint's (every rank's RNG states, the config), bar model and
        optimizer."""
        ctx, cfg = self.ctx, self.cfg
        rngs = all_gather_object(ckpt.rng_state(ctx.device))
        state = {**own, "sharded": sharded_checkpoint.DCP_DIR, "step": step, "world_size": ctx.world_size,
                 "rng": rngs, "config": cfg.to_dict()}
        hook = ctx.fault.checkpoint_hook(ctx.rank, ctx.restart_count) if ctx.fault else None
        sharded_checkpoint.save_sharded(cfg.checkpoint.dir, step, self.model, self.optimizer,
                                        state if ctx.is_main else {}, ctx.dist, keep_last=cfg.checkpoint.keep_last,
                                        before_publish=hook)
        ctx.last_checkpoint_step = step

    def _history(self) -> dict[str, Any]:
        v = self.validator
        return {**self.reporter.state(), "validation": v.best.state() if v else None,
                "stopped_early": v.stopped_early if v else False,
                "nonfinite_skipped": self.ctx.guards.nonfinite_skipped}

    def resume(self) -> int | None:
        """Load the newest valid checkpoint into model/optimizer/scheduler/RNG; returns its step.
        Detections are not restored: every attempt's are in its own records (observe/attempts.py)."""
        ctx, cfg = self.ctx, self.cfg
        state = ctx.restore_checkpoint()
        if state is None:
            return None
        if state["step"] > ctx.total_steps:
            raise ConfigError(
                f"checkpoint at step {state['step']} in {cfg.checkpoint.dir} is past this run's "
                f"{ctx.total_steps} steps; raise train.epochs / train.max_steps or use a fresh checkpoint.dir")
        if sharded_checkpoint.is_sharded_checkpoint(state):
            path = Path(cfg.checkpoint.dir) / ckpt.step_dir_name(int(state["step"]))  # verified by rank 0
            sharded_checkpoint.load_sharded(path, self.model, self.optimizer, ctx.dist)
        else:  # a full checkpoint (also one written before sharded checkpoints existed)
            load_full_state(self.model, self.optimizer, state["model"], state["optimizer"], cfg.train.sharding)
        self.scheduler.load_state_dict(state["scheduler"])
        h = state["history"]
        self.reporter.restore(h)
        if self.validator is not None:
            self.validator.restore(h)
        ctx.guards.nonfinite_skipped = int(h.get("nonfinite_skipped", 0))
        return int(state["step"])

    # ------------------------------------------------------------ the best validation's weights
    def best_root(self) -> Path:
        return Path(self.cfg.checkpoint.dir) / "best"

    def save_best(self, step: int, metric: str, value: float) -> None:
        """Collective. Rank 0 keeps the weights of the best validation so far as a checkpoint of
        its own under ``<checkpoint.dir>/best`` (atomic and checksummed like the others); only the
        newest stays. A run killed after writing it and resumed from an earlier checkpoint
        reaches the same validation again and rewrites it."""
        ctx, root = self.ctx, self.best_root()
        small = {"step": step, "metric": metric, "value": value}
        if is_sharded(self.cfg.train.sharding):  # streamed, a tensor gathered at a time (checkpoint/weights.py)
            write_weights_checkpoint(root, step, small, self.model.state_dict(), writer=ctx.is_main,
                                     file_name=WEIGHTS_FILE, metadata=SAFETENSORS_METADATA)
        else:
            state = ctx.full_state(self.model)
            if ctx.is_main:
                ckpt.remove_stale_temporaries(root)
                ckpt.write_checkpoint(root, step, {**small, "model": state})
        if ctx.is_main:
            ckpt.prune(root, 1)

    def load_best(self, best_step: int) -> dict[str, torch.Tensor] | StoredWeights:
        """The best validation's weights: a state dict, or (under FSDP) its safetensors file,
        which the model's save copies."""
        found = ckpt.find_latest_valid(self.best_root())
        if found is None or found[1]["step"] != best_step:
            got = None if found is None else found[1]["step"]
            raise RuntimeError(f"{self.best_root()} does not hold the best validation's weights (step "
                               f"{best_step}; found {got}); rerun with a fresh checkpoint.dir")
        return stored_weights(*found) or found[1]["model"]
