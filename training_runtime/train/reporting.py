"""The built-in trainer's figures: per-interval device accumulators, their exchange between ranks,
the guards' checks on them, the loss and LR history, throughput totals that survive restarts,
the progress line and telemetry (rank 0).

Ranks exchange their figures at boundaries (telemetry, ~10% progress, checkpoints, validations,
the last step) in an all-gather launched asynchronously and read one interval later, so reporting
costs no host-device sync; where the run synchronises anyway (checkpoint, validation, end) it is
read at once, so checkpointed history and totals are complete.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from training_runtime.observe import guards
from training_runtime.observe.interval_gather import IntervalGather, IntervalTimer, PendingGather
from training_runtime.observe.telemetry import SystemStats, progress_line
from training_runtime.train.context import TrainingContext
from training_runtime.train.guarding import slowdown_bits


class Interval:
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


class IntervalReporter:
    """Closes intervals, checks and records their figures, and reports them (rank 0)."""

    def __init__(self, ctx: TrainingContext, stats: SystemStats, validation_due: Callable[[int], bool]):
        self.ctx, self.cfg, self.stats, self.validation_due = ctx, ctx.config, stats, validation_due
        self.total_steps = ctx.total_steps
        self.gather = IntervalGather(ctx.device, ctx.world_size)
        self.pending: PendingGather | None = None
        self.unread_timer: tuple[IntervalTimer, int, int] | None = None  # last closed: timer, steps, end step
        self.loss_history: list[tuple[int, float]] = []
        self.lr_history: list[tuple[int, float]] = []
        self.totals = RunTotals.empty(ctx.world_size)
        self.start_step, self.t_start = 0, time.perf_counter()

    def start(self, step: int) -> None:
        self.start_step, self.t_start = step, time.perf_counter()

    # ------------------------------------------------------------ checkpointed state
    def state(self) -> dict[str, Any]:
        return {"loss_history": [list(x) for x in self.loss_history], "lr_history": [list(x) for x in self.lr_history],
                "totals": self.totals.to_dict()}

    def restore(self, h: dict[str, Any]) -> None:
        self.loss_history = [tuple(x) for x in h["loss_history"]]
        self.lr_history = [tuple(x) for x in h["lr_history"]]
        self.totals = RunTotals.from_dict(h["totals"], self.ctx.world_size)

    # ------------------------------------------------------------ boundaries
    def is_boundary(self, step: int) -> bool:
        """Steps where ranks exchange loss and timings: telemetry, progress (~10%), checkpoints
        (so checkpointed totals are exact), validations and the last step."""
        progress_every = max(1, math.ceil(self.total_steps / 10))
        return (step % self.cfg.telemetry.every_steps == 0 or step % progress_every == 0
                or step % self.cfg.checkpoint.every_steps == 0 or step == self.total_steps
                or self.validation_due(step))

    def telemetry_due(self, step: int) -> bool:
        return step % self.cfg.telemetry.every_steps == 0 or step == self.total_steps

    def close(self, iv: Interval, step: int, epoch: int, lr: float, *, flush: bool) -> None:
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
        sample = self.stats.sample() if self.telemetry_due(step) else {}
        temp = float(sample.get("gpu_temperature_c", -1.0))
        mine = self.gather.pack([iv.loss, iv.grad_norm, iv.nonfinite, iv.first_nonfinite, iv.nonfinite_loss],
                                [iv.steps, iv.time_s, iv.wait_s, gpu_s, gpu_steps, iv.compute_s, temp,
                                 slowdown_bits(sample), iv.loss_steps])
        launched = self.gather.launch(mine, meta={"step": step, "epoch": epoch, "lr": lr, "samples": iv.samples,
                                                  "steps": iv.steps, "gpu_upto": gpu_upto, "sample": sample})
        self.finish_pending()
        self.pending, self.unread_timer = launched, (iv.timer, iv.steps, step)
        if flush:
            self.finish_pending()

    def finish_pending(self) -> None:
        """Read and record the gathered figures in flight, if any."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._record(pending.read(), **pending.meta)

    def _record(self, per_rank: list[list[float]], *, step: int, epoch: int, lr: float, samples: int, steps: int,
                gpu_upto: int | None, sample: dict[str, Any]) -> None:
        """Check the guards, average the loss, add per-rank timings to the totals, record history,
        report. Every rank runs this on the same gathered rows, so all reach the same verdicts.
        ``per_rank`` rows: [loss sum, last grad norm, non-finite steps, first non-finite step,
        steps with a non-finite loss, steps, host seconds, wait seconds, GPU seconds of the rank's
        previous interval (-1: none), its steps, compute seconds, GPU temperature (-1: none),
        harmful slowdown bits, steps whose loss is in the sum]."""
        g, totals = self.ctx.guards, self.totals
        if g.enabled:
            g.check_nonfinite([r[2] for r in per_rank], [r[3] for r in per_rank], [r[4] for r in per_rank])
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
        g.check_health(step, steps=steps, loss=loss, compute_s=[r[10] for r in per_rank],
                       step_s=times, wait_s=[w for _, w in ranks], temperatures=[r[11] for r in per_rank],
                       slowdown_bits=[int(r[12]) for r in per_rank])
        if self.ctx.is_main:
            self._report(per_rank, step=step, epoch=epoch, lr=lr, samples=samples, steps=steps, loss=loss,
                         mean_time=mean_time, gpu_upto=gpu_upto, sample=sample)

    def _report(self, per_rank: list[list[float]], *, step: int, epoch: int, lr: float, samples: int, steps: int,
                loss: float, mean_time: float, gpu_upto: int | None, sample: dict[str, Any]) -> None:
        cfg, reporter = self.cfg, self.ctx.reporter
        ranks = [(r[6], r[7]) for r in per_rank]
        times = [t for t, _ in ranks]
        sps = samples / max(1e-12, mean_time)
        if step % max(1, math.ceil(self.total_steps / 10)) == 0 or step == self.total_steps:
            reporter.info(progress_line(
                epoch=epoch + 1, epochs=cfg.train.epochs, step=step, total=self.total_steps,
                start_step=self.start_step, loss=loss, samples_per_second=sps,
                elapsed_s=time.perf_counter() - self.t_start))
        if not self.telemetry_due(step):
            return
        gpu = {}
        if all(r[8] >= 0 and r[9] > 0 for r in per_rank):  # CUDA events, an interval behind
            gpu = {"per_rank_gpu_step_time_s": [r[8] / r[9] for r in per_rank], "gpu_time_upto_step": gpu_upto}
        if all(r[11] >= 0 for r in per_rank):
            gpu["per_rank_gpu_temperature_c"] = [r[11] for r in per_rank]
        reporter.custom({
            "kind": "telemetry", "step": step, "epoch": epoch + 1, "loss": loss, "lr": lr,
            "samples_per_second": sps, "grad_norm": per_rank[0][1],
            "data_wait_share": sum(w for _, w in ranks) / max(1e-12, sum(times)),
            "per_rank_step_time_s": [t / max(1, steps) for t in times],
            "per_rank_compute_time_s": [r[10] / max(1, r[5]) for r in per_rank],
            "per_rank_data_wait_share": [w / max(1e-12, t) for t, w in ranks],
            **gpu, **sample, **self.ctx._gang_figures()})

    # ------------------------------------------------------------ metrics.json
    def metrics(self, step: int, attempt_steps: int, resumed: int | None) -> dict[str, Any]:
        """The trainer's figures of the whole run (the context adds attempts and detections)."""
        ctx, cfg, t = self.ctx, self.cfg, self.totals
        if not self.loss_history:
            raise RuntimeError(f"no loss was recorded; checkpoint.dir {cfg.checkpoint.dir} holds a "
                               "finished run without history; use a fresh checkpoint.dir")
        return {
            "final_loss": self.loss_history[-1][1],
            "samples_per_second": t.samples / max(1e-12, t.train_time_s),
            "data_wait_share": sum(t.wait_s) / max(1e-12, sum(t.step_time_s)),
            "data_wait_s_total": sum(t.wait_s),
            "steps": step, "total_steps": self.total_steps, "steps_this_attempt": attempt_steps,
            "steps_per_epoch": ctx.steps_per_epoch,
            "epochs": round(step / ctx.steps_per_epoch, 4),
            "samples_seen": t.samples, "train_time_s": t.train_time_s,
            "world_size": ctx.world_size, "backend": ctx.dist.backend, "device": ctx.device.type,
            "sharding": cfg.train.sharding,
            "loss_history": [list(x) for x in self.loss_history],
            "lr_history": [list(x) for x in self.lr_history],
            "per_rank_step_time_s": [s / max(1, t.steps_timed) for s in t.step_time_s],
            "per_rank_data_wait_share": [w / max(1e-12, s) for s, w in zip(t.step_time_s, t.wait_s)],
            "checkpoint_stall_s_total": t.checkpoint_stall_s,
            "resumed_from_step": resumed,
            "restart_count": ctx.restart_count,
            "commit_id": cfg.data.commit_id,
            "task": ctx.task.name,
            "nonfinite_skipped": ctx.guards.nonfinite_skipped,
        }
