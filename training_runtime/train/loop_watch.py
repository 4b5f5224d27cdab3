"""The per-step figures of a training function, as its context sees them, for the guards.

The built-in trainer measures its own steps; a training function's steps are what happens between
two batches the context hands out (``ctx.epochs``). For each step the context knows when its
batch was handed out, how long the loader made it wait for it, and, for a model built by
``ctx.build_model``, when the model's first forward on it ended: that rank's own work before any
gradient exchange, which is what tells a straggler apart (after the exchange every rank waits for
the slowest). The first ``WARMUP_STEPS`` steps of an attempt are not timed for it: compilation,
and DDP's bucket rebuild in its second forward, which waits on a broadcast from rank 0. Every
``telemetry.every_steps`` steps the ranks exchange these figures and the same stall, straggler and
GPU-health checks run as for the built-in trainer. The exchange is a small host-side gather on the
gloo I/O group, inside the batch iterator, which every rank runs in step.

A forward that itself holds a collective (FSDP's all-gathers, DDP's buffer broadcast for models
with BatchNorm) makes every rank's figure include the wait for the slowest, as it does for the
built-in trainer: a straggler is then missed rather than misnamed.
"""

from __future__ import annotations

import time

import torch

from training_runtime.distributed.process_group import DistInfo, all_gather_object
from training_runtime.observe.telemetry import SystemStats
from training_runtime.train.guarding import Guards, slowdown_bits

WARMUP_STEPS = 2


class LoopWatch:
    def __init__(self, guards: Guards, dist: DistInfo, every_steps: int):
        self.guards, self.dist, self.every = guards, dist, every_steps
        self.stats = SystemStats(dist.device)
        self.last_step: int | None = None  # the step whose batch was handed out last
        self.handed_at = 0.0
        self.forward_done = True
        self.handed = 0  # batches handed out in this attempt
        self._reset()

    def _reset(self) -> None:
        self.steps, self.time_s, self.wait_s, self.compute_s, self.timed = 0, 0.0, 0.0, 0.0, 0

    def gpu_name(self) -> str | None:
        return self.stats.describe().get("gpu_name")

    def forward_ended(self) -> None:
        """The model's forward hook: the first forward after a batch ends this rank's own work."""
        if not self.forward_done:
            self.forward_done = True
            if self.handed > WARMUP_STEPS:
                self.compute_s += time.perf_counter() - self.handed_at
                self.timed += 1

    def handing_out(self, step: int, wait_s: float) -> None:
        """Before the batch of ``step`` (1-based) is handed out, after the loader waited ``wait_s``
        for it: the step before it has ended."""
        now = time.perf_counter()
        if self.last_step is not None and step == self.last_step + 1:
            self.steps += 1
            self.time_s += now - self.handed_at
            self.guards.beat(self.last_step)
            if self.last_step % self.every == 0:
                self._close_interval(self.last_step)
        self.wait_s += wait_s
        self.handed += 1
        self.last_step, self.handed_at, self.forward_done = step, time.perf_counter(), False

    def _close_interval(self, step: int) -> None:
        """Collective: every rank's figures of the interval, then the guards' checks."""
        sample = self.stats.sample()
        mine = [self.steps, self.time_s, self.wait_s, self.compute_s, self.timed,
                float(sample.get("gpu_temperature_c", -1.0)), slowdown_bits(sample)]
        rows = all_gather_object(mine, group=self.dist.io_group)
        self._reset()
        steps = int(rows[0][0])
        timed = all(r[4] > 0 for r in rows)  # a forward was timed on every rank (a ctx.build_model model)
        self.guards.check_health(
            step, steps=steps, loss=None,  # losses: the reported ones (Guards.check_reported)
            # As sums over the interval's steps, the timed steps' mean standing for the untimed ones.
            compute_s=[r[3] / r[4] * steps for r in rows] if timed else None,
            step_s=[r[1] for r in rows], wait_s=[r[2] for r in rows],
            temperatures=[r[5] for r in rows], slowdown_bits=[int(r[6]) for r in rows])

    def watch_model(self, model: torch.nn.Module) -> None:
        model.register_forward_hook(lambda module, inputs, output: self.forward_ended())

    def close(self) -> None:
        self.stats.close()
