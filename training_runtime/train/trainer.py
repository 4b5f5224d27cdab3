"""The built-in training loop: the task's loss on the context's batches, optimizer and schedule,
validation with early stopping and keep_best, checkpoints, telemetry and outputs. Everything it
touches outside the loop (data, model building, checkpoints, reporting, the stop signal, the
model files) goes through ``TrainingContext``, the same context a user's training function gets."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import random
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from training_runtime.checkpoint import full as ckpt
from training_runtime.checkpoint import sharded as sharded_checkpoint
from training_runtime.config import ConfigError, RunConfig
from training_runtime.distributed.fsdp import full_optimizer_state, is_sharded, load_full_state
from training_runtime.distributed.process_group import all_gather_object
from training_runtime.observe import guards
from training_runtime.observe.guards import Detection, HangWatchdog, NonFiniteLoss, RankPlace, WindowedTimes
from training_runtime.observe.interval_gather import IntervalGather, IntervalTimer, PendingGather
from training_runtime.observe.telemetry import SystemStats, progress_line
from training_runtime.train.best import BestTracker
from training_runtime.train.context import TrainingContext

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class FaultInjection:
    """Test hook: rank ``rank`` SIGKILLs itself right after optimizer step ``step`` on the first
    attempt (TORCHELASTIC_RESTART_COUNT 0), so a restarted attempt runs through. With
    ``in_checkpoint_write`` the kill comes inside the write of checkpoint ``step`` instead: the
    state file is on disk, the checkpoint is not yet published."""

    rank: int = -1
    step: int = -1
    in_checkpoint_write: bool = False
    slow_rank: int | None = None  # this rank sleeps slow_rank_s before each forward (a straggler)
    slow_rank_s: float = 0.0
    slow_loader_s: float = 0.0  # every batch load sleeps this long (a data stall)
    stop_rank: int | None = None  # this rank SIGSTOPs itself after step stop_step on attempt 0 (a hang)
    stop_step: int = -1

    def kill_mid_step(self, rank: int, step: int, restart_count: int) -> bool:
        return not self.in_checkpoint_write and restart_count == 0 and rank == self.rank and step == self.step

    def kill_in_checkpoint_write(self, rank: int, step: int, restart_count: int) -> bool:
        return self.in_checkpoint_write and restart_count == 0 and rank == self.rank and step == self.step


def make_optimizer(cfg: RunConfig, model: torch.nn.Module, device: torch.device | None = None) -> torch.optim.Optimizer:
    """AdamW or SGD; on CUDA the fused implementation (one kernel for the whole update instead of
    several per parameter group, and no host round trip)."""
    t = cfg.train
    fused = {"fused": True} if device is not None and device.type == "cuda" else {}
    if t.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay, **fused)
    return torch.optim.SGD(model.parameters(), lr=t.lr, momentum=0.9, weight_decay=t.weight_decay, **fused)


def lr_multiplier(schedule: str, warmup_steps: int, total_steps: int, step: int) -> float:
    """LR factor for optimizer step ``step`` (0-based)."""
    if warmup_steps and step < warmup_steps and schedule != "cosine":  # cosine: no warmup
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    start = warmup_steps if schedule == "linear_warmup_cosine" else 0
    span = max(1, total_steps - start)
    progress = min(1.0, (step - start) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class RunTotals:
    """Throughput figures of the whole run, carried in checkpoints so restarts keep them."""

    samples: int
    train_time_s: float  # time in training steps (mean over ranks), checkpoint stalls excluded
    steps_timed: int
    step_time_s: list[float]  # per rank
    wait_s: list[float]  # per rank: time waiting for the next batch
    checkpoint_stall_s: float

    @classmethod
    def empty(cls, world_size: int) -> RunTotals:
        return cls(0, 0.0, 0, [0.0] * world_size, [0.0] * world_size, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], world_size: int) -> RunTotals:
        t = cls(**d)
        if len(t.step_time_s) != world_size:  # per-rank figures restart with a new world size
            t.steps_timed, t.step_time_s, t.wait_s = 0, [0.0] * world_size, [0.0] * world_size
        return t


class _Interval:
    """This rank's figures since the last boundary."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)  # summed on device: no sync per step
        self.grad_norm = torch.zeros((), device=device)  # the last step's
        self.nonfinite = torch.zeros((), device=device)  # steps with a non-finite loss or gradient
        self.nonfinite_loss = torch.zeros((), device=device)  # ... where the loss itself was
        self.first_nonfinite = torch.full((), -1.0, device=device)  # the first of them (-1: none)
        self.steps, self.samples, self.time_s, self.wait_s = 0, 0, 0.0, 0.0
        self.loss_steps = 0  # steps whose loss is in ``loss`` (a skipped batch's is not)
        self.compute_s = 0.0  # host time from a step's start to its loss, before any collective
        self.timer = IntervalTimer(device)

    def add(self, time_s: float, wait_s: float, samples: int) -> None:
        self.steps += 1
        self.samples += samples
        self.time_s += time_s
        self.wait_s += wait_s


class TrainingPreempted(RuntimeError):
    """SIGTERM arrived; a checkpoint was saved and a restart resumes from it."""


class Trainer:
    def __init__(self, cfg: RunConfig, info, reporter=None, fault: FaultInjection | None = None,
                 restart_count: int = 0, context: TrainingContext | None = None):
        """``info``: the DistInfo of this process; ``restart_count``: torchrun's
        TORCHELASTIC_RESTART_COUNT (reported, and the fault hook fires only on attempt 0)."""
        self.cfg, self.fault, self.restart_count = cfg, fault, restart_count
        self.ctx = context or TrainingContext(cfg, info, reporter, restart_count, fault)
        self.info = self.ctx.dist
        self.reporter = self.ctx.reporter
        self.task = self.ctx.task
        self.num_samples = self.ctx.num_train_samples
        self.local_batch = self.ctx.local_batch_size
        self.steps_per_epoch = self.ctx.steps_per_epoch
        self.total_steps = self.ctx.total_steps
        v = cfg.validation
        if v.enabled:
            metric, mode = cfg.monitor()
            self.best: BestTracker | None = BestTracker(metric, mode, v.min_delta, v.patience)
        else:
            self.best = None
        self.stopped_early = False
        self.pruned: str | None = None  # why a sweep stopped this trial (its pruner), else None
        self.pruned_at_step: int | None = None

    # ------------------------------------------------------------ setup
    def _build(self) -> None:
        cfg = self.cfg
        self.model = self.ctx.build_model()
        self.optimizer = make_optimizer(cfg, self.model, self.info.device)
        t = cfg.train
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(t.lr_schedule, t.warmup_steps, self.total_steps, s))

    # ------------------------------------------------------------ checkpoints
    def _save(self, step: int) -> float:
        """Collective. Returns the time training stood still for this save."""
        t0 = time.perf_counter()
        self._finish_pending()  # the checkpoint holds every interval's history and totals
        with self.watchdog.paused():
            self._save_now(step)
        return time.perf_counter() - t0

    def _save_now(self, step: int) -> None:
        own = {"epoch": step // self.steps_per_epoch, "step_in_epoch": step % self.steps_per_epoch,
               "scheduler": self.scheduler.state_dict(), "history": self._history_state()}
        if self.cfg.checkpoint.resolved_format(self.cfg.train.sharding) == "sharded":
            self._save_sharded(step, own)
            return
        sharding = self.cfg.train.sharding
        model_sd = self.ctx.full_state(self.model)
        optim_sd = full_optimizer_state(self.model, self.optimizer, sharding)
        self.ctx.save_checkpoint(step, {**own, "model": model_sd, "optimizer": optim_sd})

    def _save_sharded(self, step: int, own: dict[str, Any]) -> None:
        """Collective: every rank writes its own shards; rank 0 adds the trainer's state with the
        same keys as a full checkpoint's (every rank's RNG states, the config), bar model and
        optimizer."""
        info, cfg = self.info, self.cfg
        rngs = all_gather_object(ckpt.rng_state(info.device))
        state = {**own, "sharded": sharded_checkpoint.DCP_DIR, "step": step, "world_size": info.world_size,
                 "rng": rngs, "config": cfg.to_dict()}
        sharded_checkpoint.save_sharded(cfg.checkpoint.dir, step, self.model, self.optimizer,
                                        state if info.is_main else {}, info, keep_last=cfg.checkpoint.keep_last,
                                        before_publish=self._kill_in_checkpoint_write)
        self.ctx.last_checkpoint_step = step

    def _kill_in_checkpoint_write(self, step: int) -> None:
        """The fault hook inside a sharded checkpoint's write: shards on disk, nothing published."""
        if self.fault and self.fault.kill_in_checkpoint_write(self.info.rank, step, self.restart_count):
            os.kill(os.getpid(), signal.SIGKILL)

    def _history_state(self) -> dict[str, Any]:
        return {"loss_history": [list(x) for x in self.loss_history],
                "lr_history": [list(x) for x in self.lr_history], "totals": self.totals.to_dict(),
                "validation": self.best.state() if self.best else None, "stopped_early": self.stopped_early,
                "detections": self.detections, "nonfinite_skipped": self.nonfinite_skipped}

    def _resume(self) -> int | None:
        """Load the newest valid checkpoint into model/optimizer/scheduler/RNG; returns its step."""
        state = self.ctx.restore_checkpoint()
        if state is None:
            return None
        if state["step"] > self.total_steps:
            raise ConfigError(
                f"checkpoint at step {state['step']} in {self.cfg.checkpoint.dir} is past this run's "
                f"{self.total_steps} steps; raise train.epochs / train.max_steps or use a fresh checkpoint.dir")
        if sharded_checkpoint.is_sharded_checkpoint(state):
            path = Path(self.cfg.checkpoint.dir) / ckpt.step_dir_name(int(state["step"]))  # verified by rank 0
            sharded_checkpoint.load_sharded(path, self.model, self.optimizer, self.info)
        else:  # a full checkpoint (also one written before sharded checkpoints existed)
            load_full_state(self.model, self.optimizer, state["model"], state["optimizer"], self.cfg.train.sharding)
        self.scheduler.load_state_dict(state["scheduler"])
        h = state["history"]
        self.loss_history = [tuple(x) for x in h["loss_history"]]
        self.lr_history = [tuple(x) for x in h["lr_history"]]
        self.totals = RunTotals.from_dict(h["totals"], self.info.world_size)
        if self.best is not None and h.get("validation"):
            self.best.restore(h["validation"])
        self.stopped_early = bool(h.get("stopped_early", False))
        self.detections = list(h.get("detections", []))
        self.nonfinite_skipped = int(h.get("nonfinite_skipped", 0))
        return int(state["step"])

    # ------------------------------------------------------------ best model
    def _best_root(self) -> Path:
        return Path(self.cfg.checkpoint.dir) / "best"

    def _save_best(self, step: int) -> None:
        """Collective. Rank 0 keeps the weights of the best validation so far as a checkpoint of
        its own under ``<checkpoint.dir>/best`` (atomic and checksummed like the others); only the
        newest stays. A run killed after writing it and resumed from an earlier checkpoint
        reaches the same validation again and rewrites it."""
        state = self.ctx.full_state(self.model)
        if self.info.is_main:
            root = self._best_root()
            ckpt.remove_stale_temporaries(root)
            ckpt.write_checkpoint(root, step, {"step": step, "model": state, "metric": self.best.metric,
                                               "value": self.best.best_value})
            ckpt.prune(root, 1)

    def _load_best(self) -> dict[str, torch.Tensor]:
        found = ckpt.find_latest_valid(self._best_root())
        if found is None or found[1]["step"] != self.best.best_step:
            got = None if found is None else found[1]["step"]
            raise RuntimeError(f"{self._best_root()} does not hold the best validation's weights (step "
                               f"{self.best.best_step}; found {got}); rerun with a fresh checkpoint.dir")
        return found[1]["model"]

    # ------------------------------------------------------------ training
    def _train_step(self, batch: dict[str, torch.Tensor], iv: _Interval, step: int) -> torch.Tensor:
        """Optimizer step ``step`` (1-based) on ``batch``."""
        t = self.cfg.train
        t0 = time.perf_counter()
        if self.fault and self.fault.slow_rank == self.info.rank:
            time.sleep(self.fault.slow_rank_s)  # test hook: this rank's own work takes longer
        accum = t.grad_accum_steps
        n = len(next(iter(batch.values())))
        parts = {k: v.tensor_split(accum) for k, v in batch.items()}
        chunks = [{k: parts[k][i] for k in batch} for i in range(accum)]
        chunks = [c for c in chunks if len(next(iter(c.values())))]
        total = torch.zeros((), device=self.info.device)
        # FSDP/HSDP compute in bf16 through their MixedPrecisionPolicy; autocast would re-cast the
        # (already bf16) weights on every forward.
        bf16 = t.precision == "bf16" and not is_sharded(t.sharding)
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            rows = len(next(iter(chunk.values())))
            with self._grad_sync(last), torch.autocast(self.info.device.type, dtype=torch.bfloat16,
                                                       enabled=bf16):
                outputs, targets = self.task.forward(self.model, chunk)
                loss = self.task.loss(outputs, targets) * (rows / n)
            if i == 0:  # the first chunk's forward: this rank's own work, before any gradient exchange
                iv.compute_s += time.perf_counter() - t0
            loss.backward()
            total += loss.detach().float()
        if not self.cfg.guards.enabled:
            if t.grad_clip_norm is not None:
                iv.grad_norm = self._grad_norm()
            self._apply_update(skip=False)
            iv.loss_steps += 1
            return total
        norm = self._grad_norm()
        iv.grad_norm = norm
        # Non-finite loss or gradient, counted on the device (no synchronisation) and read with the
        # interval's figures; skipping a batch has to be decided now, so it costs a sync.
        bad_loss = ~torch.isfinite(total)
        bad = (bad_loss | ~torch.isfinite(norm)).float()
        iv.nonfinite += bad
        iv.nonfinite_loss += bad_loss.float()
        iv.first_nonfinite = torch.where((bad > 0) & (iv.first_nonfinite < 0),
                                         torch.full_like(iv.first_nonfinite, step), iv.first_nonfinite)
        skip = bool(self.cfg.guards.nonfinite_skip_batches) and self._any_rank_bad(bad)
        self._apply_update(skip=skip)
        if skip:  # left out of the interval's loss: its sum and its count of steps
            return torch.zeros_like(total)
        iv.loss_steps += 1
        return total

    def _apply_update(self, *, skip: bool) -> None:
        """The optimizer step (none for a skipped batch), then the schedule's step either way (the
        batch is consumed: the schedule stays aligned with the data) and the gradients cleared."""
        if not skip:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _grad_norm(self) -> torch.Tensor:
        """The global gradient norm (clipping to train.grad_clip_norm when set): one fused pass over
        the gradients, which also catches a non-finite gradient the loss did not show."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.train.grad_clip_norm
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        elif params:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        else:
            norm = torch.zeros((), device=self.info.device)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor under FSDP

    def _any_rank_bad(self, bad: torch.Tensor) -> bool:
        flag = bad.detach().clone()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _grad_sync(self, enabled: bool):
        if is_sharded(self.cfg.train.sharding):
            self.model.set_requires_gradient_sync(enabled)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if enabled else self.model.no_sync()

    def _validation_due(self, step: int) -> bool:
        if self.best is None:
            return False
        every = self.cfg.validation.every_steps
        due = step % every == 0 if every else step % self.steps_per_epoch == 0
        return due or step == self.total_steps

    def _validate(self, step: int) -> None:
        """Collective: evaluate on the validation split, track the best, keep its weights."""
        with self.watchdog.paused():
            self._validate_now(step)

    def _validate_now(self, step: int) -> None:
        metrics = self.ctx.evaluate(self.model)
        self.model.train()
        improved = self.best.observe(step, metrics)
        if improved and self.cfg.validation.keep_best:
            self._save_best(step)
        scalars = {f"validation_{k}": v for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.info.is_main:
            self.reporter.custom({"kind": "validation", "step": step, **scalars,
                                  "best_step": self.best.best_step, "monitor": self.best.metric})
            self.reporter.info(f"validation at step {step}: {self.best.metric} "
                               f"{metrics[self.best.metric]:.4f} (best {self.best.best_value:.4f} at step "
                               f"{self.best.best_step})")
        if self.best.should_stop:
            self.stopped_early = True
            if self.info.is_main:
                self.reporter.info(f"early stopping at step {step}: no {self.best.metric} improvement in "
                                   f"{self.best.since_best} validations")
        # A sweep watching this trial reads the validation, and may answer with a stop request that
        # the next validation sees (training_runtime/train/trial_channel.py).
        self.ctx.report_validation(step, metrics)
        reason = self.ctx.prune_requested()
        if reason is not None:
            self.stopped_early, self.pruned, self.pruned_at_step = True, reason, step
            if self.info.is_main:
                self.reporter.info(f"stopped at step {step}: {reason}")

    def run(self) -> dict[str, Any]:
        cfg, info, ctx = self.cfg, self.info, self.ctx
        ctx.split("train")  # shards checked before the model is built
        if self.best is not None:
            ctx.split("validation")
        self._build()
        self.loss_history: list[tuple[int, float]] = []
        self.lr_history: list[tuple[int, float]] = []
        self.totals = RunTotals.empty(info.world_size)
        self.detections: list[dict[str, Any]] = []
        self.nonfinite_skipped = 0
        resumed = self._resume()
        step = resumed or 0
        self.stats = SystemStats(info.device)  # every rank: each GPU's health is checked
        gpu = self.stats.describe().get("gpu_name")
        self.places = [RankPlace(**p) for p in all_gather_object(
            {"host": socket.gethostname(), "gpu": f"cuda:{info.local_rank} {gpu}" if gpu else None})]
        self.recent_losses: collections.deque[float] = collections.deque(maxlen=cfg.guards.loss_spike_window)
        self.compute_window = WindowedTimes(info.world_size, cfg.guards.straggler_window)
        self.last_warned: dict[tuple[str, int | None], int] = {}
        self.watchdog = HangWatchdog(cfg.guards.hang_timeout_s if cfg.guards.enabled else None, info.rank,
                                     on_hang=self._report_hang)
        self.watchdog.start()
        try:
            return self._run_from(step, resumed)
        finally:
            self.watchdog.close()
            self.stats.close()

    def _run_from(self, step: int, resumed: int | None) -> dict[str, Any]:
        cfg, info, ctx = self.cfg, self.info, self.ctx
        if info.is_main:
            gpu = self.stats.describe().get("gpu_name")
            self.reporter.info(
                f"training {cfg.model.name} ({self.task.name}) on {self.num_samples} samples, {info.world_size} "
                f"rank(s) {info.backend}/{info.device.type}{f' ({gpu})' if gpu else ''}, {self.steps_per_epoch} "
                f"steps/epoch, {self.total_steps} steps, starting at step {step}")
        self.model.train()
        self.t_start = time.perf_counter()
        self.start_step = step
        attempt_steps = 0
        iv = _Interval(info.device)
        self.gather = IntervalGather(info.device, info.world_size)
        self.pending: PendingGather | None = None
        self.unread_timer: tuple[IntervalTimer, int, int] | None = None  # last closed interval: timer, steps, end step
        stop_at = self.total_steps if not self.stopped_early else step
        for epoch, batches in ctx.epochs(step) if step < stop_at else ():
            seen_wait = 0.0
            t_prev = time.perf_counter()
            for batch in batches:
                lr = self.scheduler.get_last_lr()[0]
                iv.timer.mark_start()
                iv.loss += self._train_step(batch, iv, step + 1)
                step += 1
                self.watchdog.beat(step)
                attempt_steps += 1
                now = time.perf_counter()
                iv.add(now - t_prev, batches.wait_s - seen_wait, self.local_batch * info.world_size)
                t_prev, seen_wait = now, batches.wait_s
                if self.fault and self.fault.kill_mid_step(info.rank, step, self.restart_count):
                    os.kill(os.getpid(), signal.SIGKILL)
                if (self.fault and self.fault.stop_rank == info.rank and self.fault.stop_step == step
                        and self.restart_count == 0):
                    os.kill(os.getpid(), signal.SIGSTOP)
                if self._is_boundary(step):
                    # Telemetry-only boundaries are read one interval later; where the run
                    # synchronises anyway (checkpoint, validation, end, stop) they are read now,
                    # so checkpointed history and totals are complete.
                    flush = (self._validation_due(step) or step % cfg.checkpoint.every_steps == 0
                             or step == self.total_steps)
                    self._close_interval(iv, step, epoch, lr, flush=flush)
                    iv = _Interval(info.device)
                if self._validation_due(step):
                    self._validate(step)
                preempted = step % cfg.telemetry.every_steps == 0 and ctx.should_stop()
                if (step % cfg.checkpoint.every_steps == 0 or step == self.total_steps or self.stopped_early
                        or preempted):
                    self.totals.checkpoint_stall_s += self._save(step)
                    t_prev = time.perf_counter()  # the stall is reported apart from step time
                if preempted:
                    ctx.wait_for_checkpoints()
                    raise TrainingPreempted(f"stopped on SIGTERM after saving checkpoint {step} in "
                                            f"{cfg.checkpoint.dir}; a restart resumes from it")
                if step >= self.total_steps or self.stopped_early:
                    break
            if step >= self.total_steps or self.stopped_early:
                break
        self._finish_pending()
        if ctx.last_checkpoint_step != step:
            self.totals.checkpoint_stall_s += self._save(step)
        ctx.wait_for_checkpoints()
        use_best = self.best is not None and cfg.validation.keep_best and self.best.best_step is not None
        if use_best:
            final_sd = self._load_best() if info.is_main else {}
        else:
            final_sd = ctx.full_state(self.model)
        metrics = self._metrics(step, attempt_steps, resumed)
        ctx.save_model(final_sd, training={
            "steps": step, "weights_from_step": self.best.best_step if use_best else step,
            "monitor": self.best.metric if self.best else None,
            "best_value": self.best.best_value if self.best else None})
        ctx.write_outputs(metrics)
        if info.is_main:
            self.reporter.info(f"wrote model.safetensors, model_card.json, metrics.json to {cfg.output_dir}: "
                               f"final loss {metrics['final_loss']:.4f}, {metrics['steps']} steps"
                               + (f", weights of step {self.best.best_step}" if use_best else ""))
            final = {k: v for k, v in metrics.items() if not k.endswith("_history")}
            self.reporter.custom({"kind": "final", **final})
        dist.barrier()
        return metrics

    def _is_boundary(self, step: int) -> bool:
        """Steps where ranks exchange loss and timings: telemetry, progress (~10%), checkpoints
        (so checkpointed totals are exact), validations and the last step."""
        progress_every = max(1, math.ceil(self.total_steps / 10))
        return (step % self.cfg.telemetry.every_steps == 0 or step % progress_every == 0
                or step % self.cfg.checkpoint.every_steps == 0 or step == self.total_steps
                or self._validation_due(step))

    def _telemetry_due(self, step: int) -> bool:
        return step % self.cfg.telemetry.every_steps == 0 or step == self.total_steps

    def _close_interval(self, iv: _Interval, step: int, epoch: int, lr: float, *, flush: bool) -> None:
        """Collective: launch the all-gather of this interval's figures, then read the previous
        interval's (and this one's too when ``flush``). Each gather also carries the GPU time of
        the interval before, whose end event has run by now."""
        iv.timer.mark_end()
        gpu_s, gpu_steps, gpu_upto = -1.0, 0, None
        if self.unread_timer is not None:
            timer, steps, end_step = self.unread_timer
            elapsed = timer.elapsed_s()
            if elapsed is not None:
                gpu_s, gpu_steps, gpu_upto = elapsed, steps, end_step
        # psutil/NVML reads only where telemetry is emitted, not at every boundary (with few
        # steps every step is one: the progress line's 10%).
        sample = self.stats.sample() if self._telemetry_due(step) else {}
        temp = float(sample.get("gpu_temperature_c", -1.0))
        harmful = sum(1 << i for i, name in enumerate(guards.HARMFUL_SLOWDOWNS)
                      if name in sample.get("gpu_throttle_reasons", ()))
        mine = self.gather.pack([iv.loss, iv.grad_norm, iv.nonfinite, iv.first_nonfinite, iv.nonfinite_loss],
                                [iv.steps, iv.time_s, iv.wait_s, gpu_s, gpu_steps, iv.compute_s, temp, harmful,
                                 iv.loss_steps])
        launched = self.gather.launch(mine, meta={"step": step, "epoch": epoch, "lr": lr, "samples": iv.samples,
                                                  "steps": iv.steps, "gpu_upto": gpu_upto, "sample": sample})
        self._finish_pending()
        self.pending, self.unread_timer = launched, (iv.timer, iv.steps, step)
        if flush:
            self._finish_pending()

    def _finish_pending(self) -> None:
        """Read and record the gathered figures in flight, if any."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._record_interval(pending.read(), **pending.meta)

    def _record_interval(self, per_rank: list[list[float]], *, step: int, epoch: int, lr: float, samples: int,
                         steps: int, gpu_upto: int | None, sample: dict[str, Any]) -> None:
        """Check the guards, average the loss, add per-rank timings to the totals, record history,
        report. Every rank runs this on the same gathered rows, so all reach the same verdicts.
        ``per_rank`` rows: [loss sum, last grad norm, non-finite steps, first non-finite step,
        steps with a non-finite loss, steps, host seconds, wait seconds, GPU seconds of the rank's
        previous interval (-1: none), its steps, compute seconds, GPU temperature (-1: none),
        harmful slowdown bits, steps whose loss is in the sum]."""
        info, cfg, totals = self.info, self.cfg, self.totals
        if cfg.guards.enabled:
            self._check_nonfinite(per_rank, step)
        loss = guards.interval_mean_loss([r[0] for r in per_rank], [r[13] for r in per_rank])
        ranks = [(r[6], r[7]) for r in per_rank]
        times = [t for t, _ in ranks]
        mean_time = sum(times) / len(times)
        totals.samples += samples
        totals.steps_timed += steps
        totals.train_time_s += mean_time
        for r, (t, w) in enumerate(ranks):
            totals.step_time_s[r] += t
            totals.wait_s[r] += w
        self.loss_history.append((step, loss))
        self.lr_history.append((step, lr))
        if cfg.guards.enabled:
            self._check_health(per_rank, step, loss, steps)
        if not info.is_main:
            return
        sps = samples / max(1e-12, mean_time)
        if step % max(1, math.ceil(self.total_steps / 10)) == 0 or step == self.total_steps:
            self.reporter.info(progress_line(
                epoch=epoch + 1, epochs=cfg.train.epochs, step=step, total=self.total_steps,
                start_step=self.start_step, loss=loss, samples_per_second=sps,
                elapsed_s=time.perf_counter() - self.t_start))
        if self._telemetry_due(step):
            gpu = {}
            if all(r[8] >= 0 and r[9] > 0 for r in per_rank):  # CUDA events, an interval behind
                gpu = {"per_rank_gpu_step_time_s": [r[8] / r[9] for r in per_rank], "gpu_time_upto_step": gpu_upto}
            if all(r[11] >= 0 for r in per_rank):
                gpu["per_rank_gpu_temperature_c"] = [r[11] for r in per_rank]
            self.reporter.custom({
                "kind": "telemetry", "step": step, "epoch": epoch + 1, "loss": loss, "lr": lr,
                "samples_per_second": sps, "grad_norm": per_rank[0][1],
                "data_wait_share": sum(w for _, w in ranks) / max(1e-12, sum(times)),
                "per_rank_step_time_s": [t / max(1, steps) for t in times],
                "per_rank_compute_time_s": [r[10] / max(1, r[5]) for r in per_rank],
                "per_rank_data_wait_share": [w / max(1e-12, t) for t, w in ranks],
                **gpu, **sample})

    # ------------------------------------------------------------ guards
    def _check_nonfinite(self, per_rank: list[list[float]], step: int) -> None:
        g = self.cfg.guards
        counts = [r[2] for r in per_rank]
        if not any(counts):
            return
        first = [r[3] if r[3] >= 0 else float("inf") for r in per_rank]
        found = guards.nonfinite_detection(counts, first, [r[4] for r in per_rank], self.places,
                                           skipped_before=self.nonfinite_skipped,
                                           skip_limit=g.nonfinite_skip_batches, checkpoint_dir=self.cfg.checkpoint.dir)
        self.nonfinite_skipped += int(max(counts))
        self._detect(found, force=True)
        if found.severity == "error":
            raise NonFiniteLoss(found.message)

    def _check_health(self, per_rank: list[list[float]], step: int, loss: float, steps: int) -> None:
        g, t = self.cfg.guards, self.cfg.train
        if math.isfinite(loss):
            self._detect(guards.loss_spike_detection(step, loss, list(self.recent_losses), g.loss_spike_factor))
            self.recent_losses.append(loss)
        self.compute_window.add([r[10] for r in per_rank], steps)
        if len(self.compute_window.entries) == self.compute_window.entries.maxlen:
            self._detect(guards.straggler_detection(step, self.compute_window.mean_per_step(), self.places,
                                                    factor=g.straggler_factor, min_excess_s=g.straggler_min_excess_s))
        if g.data_stall_share is not None:
            shares = [r[7] / max(1e-12, r[6]) for r in per_rank]
            self._detect(guards.data_stall_detection(step, shares, self.places, threshold=g.data_stall_share,
                                                     loader_threads=t.num_workers,
                                                     prefetch_batches=t.prefetch_batches))
        if any(r[11] >= 0 or r[12] for r in per_rank):
            slowdowns = [[name for i, name in enumerate(guards.HARMFUL_SLOWDOWNS) if int(r[12]) >> i & 1]
                         for r in per_rank]
            for found in guards.gpu_health_detections(step, [r[11] for r in per_rank], slowdowns, self.places,
                                                      max_temperature_c=g.gpu_max_temperature_c):
                self._detect(found)

    def _detect(self, found: Detection | None, *, force: bool = False) -> None:
        """Record a detection (all ranks, so checkpoints hold them) and report it (rank 0). A
        warning about the same detector and rank repeats at most every repeat_after_intervals."""
        if found is None:
            return
        key = (found.detector, found.rank)
        every = self.cfg.guards.repeat_after_intervals * self.cfg.telemetry.every_steps
        last = self.last_warned.get(key)
        if not force and last is not None and found.step - last < every:
            return
        self.last_warned[key] = found.step
        self.detections.append(found.to_dict())
        if self.info.is_main:
            # The orchestrator logs it at its severity as it arrives; stderr (and the rank's log file) too.
            self.reporter.custom({"kind": "detection", **found.to_dict()})
            log.warning("guard %s (%s) at step %d: %s", found.detector, found.severity, found.step, found.message)

    def _report_hang(self, found: Detection) -> None:
        """Called by the watchdog's thread before the process exits."""
        if self.info.is_main:
            self.reporter.custom({"kind": "detection", **found.to_dict()})

    def _metrics(self, step: int, attempt_steps: int, resumed: int | None) -> dict[str, Any]:
        info, cfg, t = self.info, self.cfg, self.totals
        if not self.loss_history:
            raise RuntimeError(f"no loss was recorded; checkpoint.dir {cfg.checkpoint.dir} holds a "
                               "finished run without history; use a fresh checkpoint.dir")
        return {
            "final_loss": self.loss_history[-1][1],
            "samples_per_second": t.samples / max(1e-12, t.train_time_s),
            "data_wait_share": sum(t.wait_s) / max(1e-12, sum(t.step_time_s)),
            "data_wait_s_total": sum(t.wait_s),
            "steps": step, "total_steps": self.total_steps, "steps_this_attempt": attempt_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": round(step / self.steps_per_epoch, 4),
            "samples_seen": t.samples, "train_time_s": t.train_time_s,
            "world_size": info.world_size, "backend": info.backend, "device": info.device.type,
            "sharding": cfg.train.sharding,
            "loss_history": [list(x) for x in self.loss_history],
            "lr_history": [list(x) for x in self.lr_history],
            "per_rank_step_time_s": [s / max(1, t.steps_timed) for s in t.step_time_s],
            "per_rank_data_wait_share": [w / max(1e-12, s) for s, w in zip(t.step_time_s, t.wait_s)],
            "checkpoint_stall_s_total": t.checkpoint_stall_s,
            "resumed_from_step": resumed,
            "restart_count": self.restart_count,
            "commit_id": cfg.data.commit_id,
            "task": self.task.name,
            "detections": self.detections,
            "nonfinite_skipped": self.nonfinite_skipped,
            **self._validation_figures(),
        }

    def _validation_figures(self) -> dict[str, Any]:
        if self.best is None:
            return {}
        b = self.best
        return {"monitor": b.metric, "monitor_mode": b.mode, "best_step": b.best_step, "best_value": b.best_value,
                "stopped_early": self.stopped_early, "validation_history": b.history,
                "pruned": self.pruned, "pruned_at_step": self.pruned_at_step,
                "weights_from_step": b.best_step if self.cfg.validation.keep_best else None}
