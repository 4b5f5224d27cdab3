"""The built-in training loop: the task's loss on the context's batches, optimizer and schedule,
validation with early stopping and keep_best, checkpoints, telemetry and outputs.

It is assembled from parts, each a module of its own: the optimizer step (step.py), interval
figures, history and telemetry (reporting.py), checkpoints and the best weights
(checkpointing.py), validations (validation.py). Everything outside the loop (data, model
building, checkpoint I/O, reporting, the stop signal, the guards, the model files) goes through
``TrainingContext``, the same context a user's training function gets.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed as dist

from training_runtime.config import RunConfig
from training_runtime.observe.telemetry import SystemStats
from training_runtime.train.checkpointing import TrainerCheckpoints
from training_runtime.train.context import TrainingContext
from training_runtime.train.failures import TrainingPreempted
from training_runtime.train.faults import FaultInjection
from training_runtime.train.reporting import Interval, IntervalReporter
from training_runtime.train.step import TrainStep, make_optimizer, make_scheduler
from training_runtime.train.validation import Validator

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: RunConfig, info, reporter=None, fault: FaultInjection | None = None,
                 restart_count: int = 0, context: TrainingContext | None = None):
        """``info``: the DistInfo of this process; ``restart_count``: torchrun's
        TORCHELASTIC_RESTART_COUNT (reported, and the fault hook fires only on attempt 0)."""
        self.cfg = cfg
        self.ctx = context or TrainingContext(cfg, info, reporter, restart_count, fault)

    def run(self) -> dict[str, Any]:
        with self.ctx.guarded():
            return self._run()

    def _run(self) -> dict[str, Any]:
        ctx = self.ctx
        ctx.split("train")  # shards checked before the model is built
        if self.cfg.validation.enabled:
            ctx.split("validation")
        self.model = ctx.build_model()
        self.optimizer = make_optimizer(self.cfg, self.model, ctx.device)
        self.scheduler = make_scheduler(self.cfg, self.optimizer, ctx.total_steps)
        self.stats = SystemStats(ctx.device)  # every rank: each GPU's health is checked
        self.validator = Validator(ctx) if self.cfg.validation.enabled else None
        self.figures = IntervalReporter(ctx, self.stats, self._validation_due)
        self.checkpoints = TrainerCheckpoints(ctx, self.model, self.optimizer, self.scheduler, self.figures,
                                              self.validator)
        if self.validator is not None:
            self.validator.save_best = lambda step, metric, value: self.checkpoints.save_best(step, metric, value)
        self.step = TrainStep(ctx, self.model, self.optimizer, self.scheduler)
        resumed = self.checkpoints.resume()
        ctx.guards.locate(self.stats.describe().get("gpu_name"))
        try:
            return self._run_from(resumed or 0, resumed)
        finally:
            self.stats.close()

    def _validation_due(self, step: int) -> bool:
        return self.validator is not None and self.validator.due(step)

    def _save(self, step: int) -> float:
        """Collective. Returns the time training stood still for this save."""
        t0 = time.perf_counter()
        self.figures.finish_pending()  # the checkpoint holds every interval's history and totals
        with self.ctx.guards.paused():
            self.checkpoints.save(step)
        return time.perf_counter() - t0

    @property
    def _stopped_early(self) -> bool:
        return self.validator is not None and self.validator.stopped_early

    def _run_from(self, step: int, resumed: int | None) -> dict[str, Any]:
        cfg, ctx, figures = self.cfg, self.ctx, self.figures
        if ctx.is_main:
            gpu = self.stats.describe().get("gpu_name")
            ctx.reporter.info(
                f"training {cfg.model.name} ({ctx.task.name}) on {ctx.num_train_samples} samples, {ctx.world_size} "
                f"rank(s) {ctx.dist.backend}/{ctx.device.type}{f' ({gpu})' if gpu else ''}, {ctx.steps_per_epoch} "
                f"steps/epoch, {ctx.total_steps} steps, starting at step {step}")
        self.model.train()
        figures.start(step)
        attempt_steps = 0
        iv = Interval(ctx.device)
        stop_at = ctx.total_steps if not self._stopped_early else step
        for epoch, batches in ctx.epochs(step) if step < stop_at else ():
            seen_wait = 0.0
            t_prev = time.perf_counter()
            for batch in batches:
                lr = self.scheduler.get_last_lr()[0]
                iv.timer.mark_start()
                iv.loss += self.step(batch, iv, step + 1)
                step += 1
                ctx.guards.beat(step)
                attempt_steps += 1
                now = time.perf_counter()
                # an async save's copy the optimizer step waited for is the save's stall, not the step's
                ckpt_wait = ctx.writer.take_deferred_wait_s()
                figures.totals.checkpoint_stall_s += ckpt_wait
                iv.add(now - t_prev - ckpt_wait, batches.wait_s - seen_wait, ctx.local_batch_size * ctx.world_size)
                t_prev, seen_wait = now, batches.wait_s
                if ctx.fault:
                    ctx.fault.after_step(ctx.rank, step, ctx.restart_count)
                if figures.is_boundary(step):
                    # Telemetry-only boundaries are read one interval later; where the run
                    # synchronises anyway (checkpoint, validation, end, stop) they are read now,
                    # so checkpointed history and totals are complete.
                    flush = (self._validation_due(step) or step % cfg.checkpoint.every_steps == 0
                             or step == ctx.total_steps)
                    figures.close(iv, step, epoch, lr, flush=flush)
                    iv = Interval(ctx.device)
                if self._validation_due(step):
                    self.validator.run(step, self.model)
                preempted = step % cfg.telemetry.every_steps == 0 and ctx.should_stop()
                if (step % cfg.checkpoint.every_steps == 0 or step == ctx.total_steps or self._stopped_early
                        or preempted):
                    figures.totals.checkpoint_stall_s += self._save(step)
                    t_prev = time.perf_counter()  # the stall is reported apart from step time
                if preempted:
                    ctx.wait_for_checkpoints()
                    raise TrainingPreempted(f"stopped on SIGTERM after saving checkpoint {step} in "
                                            f"{cfg.checkpoint.dir}; a restart resumes from it")
                if step >= ctx.total_steps or self._stopped_early:
                    break
            if step >= ctx.total_steps or self._stopped_early:
                break
        figures.finish_pending()
        if ctx.last_checkpoint_step != step:
            figures.totals.checkpoint_stall_s += self._save(step)
        ctx.wait_for_checkpoints()
        return self._finish(step, attempt_steps, resumed)

    def _finish(self, step: int, attempt_steps: int, resumed: int | None) -> dict[str, Any]:
        """The model (the best validation's weights with keep_best), metrics.json and the rest."""
        cfg, ctx, v = self.cfg, self.ctx, self.validator
        best_step = v.best.best_step if v is not None else None
        use_best = v is not None and cfg.validation.keep_best and best_step is not None
        if use_best:
            final_sd = self.checkpoints.load_best(best_step) if ctx.is_main else {}
        else:
            final_sd = self.model  # streamed by the context: under FSDP never gathered whole on rank 0
        metrics = {**self.figures.metrics(step, attempt_steps, resumed), **(v.figures() if v is not None else {})}
        ctx.save_model(final_sd, training={
            "steps": step, "weights_from_step": best_step if use_best else step,
            "monitor": v.best.metric if v else None, "best_value": v.best.best_value if v else None})
        metrics = ctx.write_outputs(metrics)
        if ctx.is_main:
            ctx.reporter.info(f"wrote model.safetensors, model_card.json, metrics.json to {cfg.output_dir}: "
                              f"final loss {metrics['final_loss']:.4f}, {metrics['steps']} steps"
                              + (f", weights of step {best_step}" if use_best else ""))
            final = {k: v for k, v in metrics.items() if not k.endswith("_history") and k != "attempts"}
            ctx.reporter.custom({"kind": "final", **final})
        dist.barrier()
        return metrics
