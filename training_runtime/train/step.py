"""The built-in trainer's optimizer step: optimizer and schedule, gradient accumulation, bf16,
clipping, and the non-finite counting the guards read, all without a host-device sync unless a
bad batch has to be skipped."""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.distributed as dist

from training_runtime.config import RunConfig
from training_runtime.distributed.fsdp import is_sharded
from training_runtime.train.context import TrainingContext
from training_runtime.train.reporting import Interval


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


def make_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer, total_steps: int):
    t = cfg.train
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(t.lr_schedule, t.warmup_steps, total_steps, s))


class TrainStep:
    """``step(batch, interval, n)``: optimizer step ``n`` (1-based) on ``batch``; returns the
    batch's loss (zero for a skipped one) as a device tensor, and adds its figures to ``interval``."""

    def __init__(self, ctx: TrainingContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler):
        self.ctx, self.cfg, self.model, self.optimizer, self.scheduler = ctx, ctx.config, model, optimizer, scheduler
        self.device = ctx.device

    def __call__(self, batch: dict[str, torch.Tensor], iv: Interval, step: int) -> torch.Tensor:
        t, ctx = self.cfg.train, self.ctx
        t0 = time.perf_counter()
        if ctx.fault:
            ctx.fault.slow_down(ctx.rank)  # test hook: this rank's own work takes longer
        accum = t.grad_accum_steps
        n = len(next(iter(batch.values())))
        parts = {k: v.tensor_split(accum) for k, v in batch.items()}
        chunks = [{k: parts[k][i] for k in batch} for i in range(accum)]
        chunks = [c for c in chunks if len(next(iter(c.values())))]
        total = torch.zeros((), device=self.device)
        # FSDP/HSDP compute in bf16 through their MixedPrecisionPolicy; autocast would re-cast the
        # (already bf16) weights on every forward.
        bf16 = t.precision == "bf16" and not is_sharded(t.sharding)
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            rows = len(next(iter(chunk.values())))
            with self._grad_sync(last), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
                outputs, targets = ctx.task.forward(self.model, chunk)
                loss = ctx.task.loss(outputs, targets) * (rows / n)
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
        skip = self.guard(total, iv, step)
        self._apply_update(skip=skip)
        if skip:  # left out of the interval's loss: its sum and its count of steps
            return torch.zeros_like(total)
        iv.loss_steps += 1
        return total

    def guard(self, total: torch.Tensor, iv: Interval, step: int) -> bool:
        """The guards' whole per-step work: the gradient norm, and a non-finite loss or gradient
        counted on the device (no synchronisation; read with the interval's figures, where the
        checks run). Returns whether to skip the batch, which has to be decided now, so only with
        guards.nonfinite_skip_batches does it cost a sync. benchmarks/probes.py times this alone."""
        norm = self._grad_norm()
        iv.grad_norm = norm
        bad_loss = ~torch.isfinite(total)
        bad = (bad_loss | ~torch.isfinite(norm)).float()
        iv.nonfinite += bad
        iv.nonfinite_loss += bad_loss.float()
        iv.first_nonfinite = torch.where((bad > 0) & (iv.first_nonfinite < 0),
                                         torch.full_like(iv.first_nonfinite, step), iv.first_nonfinite)
        return bool(self.cfg.guards.nonfinite_skip_batches) and self._any_rank_bad(bad)

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
            norm = torch.zeros((), device=self.device)
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
