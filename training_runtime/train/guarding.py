"""The guards of one training, held by its ``TrainingContext`` (``ctx.guards``), so the built-in
trainer and a team's training function are watched alike.

- The hang watchdog is fed by every batch the context hands out (``ctx.epochs``), every
  ``ctx.report`` and the built-in trainer's steps, and paused while the context evaluates, reads
  or writes checkpoints and saves the model.
- Non-finite values stop the run: the built-in trainer's loss and gradient, counted on the device
  (``check_nonfinite``), and every loss a training function reports (``check_reported``).
- The stall, straggler and GPU-health checks (``check_health``) read the per-rank figures of each
  telemetry interval: the trainer's, or those the context measures around a training function's
  batches and forwards (loop_watch.py).

A detection is logged, reported (rank 0, kind "detection"), appended to the attempt's records on
the checkpoint volume as it happens (observe/attempts.py, so a restarted attempt's are kept) and
listed in metrics.json. A stop names the last good checkpoint and pins it (checkpoint/full.py), so
no later attempt prunes it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from training_runtime.checkpoint import full as ckpt
from training_runtime.config import RunConfig
from training_runtime.distributed.process_group import DistInfo, all_gather_object, broadcast_object
from training_runtime.observe import guards
from training_runtime.observe.attempts import RETRYABLE, AttemptLog
from training_runtime.observe.guards import Detection, HangWatchdog, NonFiniteLoss, RankPlace, WindowedTimes
from training_runtime.observe.telemetry import Reporter

log = logging.getLogger(__name__)



# How long a rank that stops alone waits for the checkpoint rank 0 is due to have published.
DUE_CHECKPOINT_WAIT_S = 10.0

class Guards:
    def __init__(self, config: RunConfig, dist: DistInfo, reporter: Reporter, attempt_log: AttemptLog | None = None,
                 wait_for_checkpoints: Callable[[], None] | None = None):
        g = self.settings = config.guards
        self.config, self.dist, self.reporter, self.attempt_log = config, dist, reporter, attempt_log
        self.wait_for_checkpoints = wait_for_checkpoints
        self.enabled = g.enabled
        self.watchdog = HangWatchdog(g.hang_timeout_s if g.enabled else None, dist.rank, on_hang=self._on_hang)
        self.detections: list[dict[str, Any]] = []  # this attempt's (earlier attempts' are in their records)
        self.nonfinite_skipped = 0  # carried in the built-in trainer's checkpoints: the allowance spans restarts
        self.places: list[RankPlace] | None = None
        self.last_warned: dict[tuple[str, int | None], int] = {}
        self.recent_losses: collections.deque[float] = collections.deque(maxlen=g.loss_spike_window)
        self.compute_window = WindowedTimes(dist.world_size, g.straggler_window)
        self._reported_loss: dict[int, list[float]] = {}  # a training function's losses by interval

    # ------------------------------------------------------------ the watchdog
    def start(self) -> None:
        self.watchdog.start()

    def close(self) -> None:
        self.watchdog.close()

    def beat(self, step: int) -> None:
        """Step ``step`` finished (the watchdog arms at the first: compilation is not timed)."""
        self.watchdog.beat(step)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """A phase that is not a training step (evaluation, checkpoint I/O): it has its own timeouts."""
        with self.watchdog.paused():
            yield

    def _on_hang(self, found: Detection) -> None:
        """The watchdog's thread, before the process exits: a hang is retried (a restart may not hang)."""
        if self.dist.is_main:
            self.reporter.custom({"kind": "detection", **found.to_dict()})
        if self.attempt_log is not None:
            self.attempt_log.add_detection(found.to_dict())
            # With this rank's stacks as the watchdog took them: the orchestrator shows them in
            # the run's event log, where stderr does not reach.
            self.attempt_log.add_failure({"kind": RETRYABLE, "cause": "hang", "exception": None, "step": found.step,
                                          "message": found.message, "detection": found.to_dict(),
                                          "last_good_checkpoint": None, "stacks": self.watchdog.stacks})

    # ------------------------------------------------------------ where ranks run
    def locate(self, gpu_name: str | None) -> None:
        """Collective: every rank's host and GPU, for naming ranks in detections."""
        mine = {"host": socket.gethostname(), "gpu": f"cuda:{self.dist.local_rank} {gpu_name}" if gpu_name else None}
        self.places = [RankPlace(**p) for p in all_gather_object(mine)]

    # ------------------------------------------------------------ detections
    def detect(self, found: Detection | None, *, force: bool = False, shared: bool = True) -> None:
        """Record and report a detection. ``shared``: every rank reached it from the same gathered
        figures, so rank 0 reports and records it; otherwise this rank saw it alone (a value it
        reported) and records it itself. A warning about the same detector and rank repeats at
        most every guards.repeat_after_intervals intervals."""
        if found is None:
            return
        key = (found.detector, found.rank)
        every = self.settings.repeat_after_intervals * self.config.telemetry.every_steps
        last = self.last_warned.get(key)
        if not force and last is not None and found.step - last < every:
            return
        self.last_warned[key] = found.step
        self.detections.append(found.to_dict())
        if shared and not self.dist.is_main:
            return
        if self.attempt_log is not None:
            self.attempt_log.add_detection(found.to_dict())
        if self.dist.is_main:
            # The orchestrator logs it at its severity as it arrives; stderr (and the rank's log file) too.
            self.reporter.custom({"kind": "detection", **found.to_dict()})
        log.warning("guard %s (%s) at step %d: %s", found.detector, found.severity, found.step, found.message)

    def last_good_checkpoint(self, before_step: int) -> tuple[int, str] | None:
        """(step, name) of the newest published checkpoint from before ``before_step``."""
        if self.wait_for_checkpoints is not None:
            try:
                self.wait_for_checkpoints()  # an in-flight write settles first (rank 0's writer)
            except Exception as e:  # the stop proceeds with what is on disk; the write's error is told
                log.error("a checkpoint write failed while stopping the run: %s", e)
        found = self._newest_before(before_step)
        every = self.config.checkpoint.every_steps
        due = ((before_step - 1) // every) * every if every else 0
        if not self.dist.is_main and due > (found[0] if found else 0):
            # A rank that stops alone cannot wait for rank 0's writer: it waits a little for the
            # checkpoint the schedule says rank 0 is publishing (under load rank 0 may still be in
            # its rename when this rank has reached the bad step), so both name the same one.
            deadline = time.monotonic() + DUE_CHECKPOINT_WAIT_S
            while time.monotonic() < deadline and (found is None or found[0] < due):
                time.sleep(0.05)
                found = self._newest_before(before_step)
        return found

    def _newest_before(self, before_step: int) -> tuple[int, str] | None:
        for step, path in ckpt.list_checkpoints(self.config.checkpoint.dir):
            if step < before_step:
                return step, path.name
        return None

    def stop(self, build: Callable[[str | None], Detection], step: int, *, shared: bool = True) -> NoReturn:
        """End the run with the detection ``build(last_good)`` at ``step``: recorded, the last
        good checkpoint pinned, NonFiniteLoss raised (a failure no retry can fix)."""
        good = self.last_good_checkpoint(step)
        if shared and self.dist.world_size > 1:
            # Every rank stops here together: they name the one checkpoint rank 0 (which writes them,
            # and has waited for its write in flight) found. A peer listing the folder itself could
            # miss a checkpoint rank 0 was publishing at that moment.
            good = broadcast_object(good, group=self.dist.io_group)
        found = build(good[1] if good else None)
        if good is not None and (self.dist.is_main or not shared):
            ckpt.pin(self.config.checkpoint.dir, good[0], found.message)
        self.detect(found, force=True, shared=shared)
        raise NonFiniteLoss(found, good[1] if good else None)

    # ------------------------------------------------------------ checks
    def check_nonfinite(self, counts: Sequence[float], first_steps: Sequence[float],
                        loss_counts: Sequence[float]) -> None:
        """The built-in trainer's per-interval counts (every rank, the same gathered figures)."""
        if not any(counts):
            return
        g, root = self.settings, self.config.checkpoint.dir
        first = [s if s >= 0 else float("inf") for s in first_steps]

        def build(last_good: str | None) -> Detection:
            return guards.nonfinite_detection(counts, first, loss_counts, self.places, skipped_before=self.nonfinite_skipped,
                                              skip_limit=g.nonfinite_skip_batches, checkpoint_dir=root,
                                              last_good=last_good)
        found = build(None)
        if found.severity == "error":
            self.stop(build, found.step)
        self.nonfinite_skipped += int(max(counts))
        self.detect(found, force=True)

    def check_reported(self, step: int, metrics: Mapping[str, Any]) -> None:
        """A training function's ``ctx.report``: a non-finite loss stops the run at once; its losses,
        averaged per telemetry interval, feed the loss-spike check. This rank's own values."""
        if not self.enabled:
            return
        for key, value in metrics.items():
            if not (key == "loss" or key.endswith("_loss")):
                continue
            number = _number(value)
            if number is not None and not math.isfinite(number):
                rank = self.dist.rank
                self.stop(lambda good: guards.reported_nonfinite_detection(
                    step, key, number, rank, self.places, checkpoint_dir=self.config.checkpoint.dir,
                    last_good=good), step, shared=False)
        loss = _number(metrics.get("loss"))
        if loss is None:
            return
        every = self.config.telemetry.every_steps
        interval = (step - 1) // every
        for earlier in [i for i in self._reported_loss if i < interval]:
            values = self._reported_loss.pop(earlier)
            self._loss_interval((earlier + 1) * every, sum(values) / len(values), shared=False)
        self._reported_loss.setdefault(interval, []).append(loss)

    def _loss_interval(self, step: int, loss: float, *, shared: bool) -> None:
        found = guards.loss_spike_detection(step, loss, list(self.recent_losses), self.settings.loss_spike_factor)
        if found is not None and not shared and self.dist.world_size > 1:
            found = dataclasses.replace(found, rank=self.dist.rank, message=f"rank {self.dist.rank}: {found.message}")
        self.detect(found, shared=shared)
        self.recent_losses.append(loss)

    def check_health(self, step: int, *, steps: int, loss: float | None, compute_s: Sequence[float] | None,
                     step_s: Sequence[float], wait_s: Sequence[float], temperatures: Sequence[float],
                     slowdown_bits: Sequence[int]) -> None:
        """One telemetry interval's per-rank figures, the same on every rank: ``compute_s`` each
        rank's own work before any collective (None: not measured), ``step_s`` and ``wait_s`` its
        step time and the seconds of it spent waiting for batches, ``temperatures`` (-1: unknown) and NVML's harmful
        slowdown reasons as bits of guards.HARMFUL_SLOWDOWNS."""
        if not self.enabled:
            return
        g, t = self.settings, self.config.train
        if loss is not None and math.isfinite(loss):
            self._loss_interval(step, loss, shared=True)
        if compute_s is not None:
            self.compute_window.add(compute_s, steps)
            if len(self.compute_window.entries) == self.compute_window.entries.maxlen:
                self.detect(guards.straggler_detection(step, self.compute_window.mean_per_step(), self.places,
                                                       factor=g.straggler_factor, min_excess_s=g.straggler_min_excess_s))
        if g.data_stall_share is not None:
            share = [w / max(1e-12, s) for s, w in zip(step_s, wait_s)]
            self.detect(guards.data_stall_detection(step, share, self.places, threshold=g.data_stall_share,
                                                    loader_threads=t.num_workers, prefetch_batches=t.prefetch_batches,
                                                    wait_per_step_s=[w / max(1, steps) for w in wait_s],
                                                    min_wait_s=g.data_stall_min_wait_s))
        if any(temp >= 0 or bits for temp, bits in zip(temperatures, slowdown_bits)):
            slowdowns = [[name for i, name in enumerate(guards.HARMFUL_SLOWDOWNS) if int(bits) >> i & 1]
                         for bits in slowdown_bits]
            for found in guards.gpu_health_detections(step, temperatures, slowdowns, self.places,
                                                      max_temperature_c=g.gpu_max_temperature_c):
                self.detect(found)


def slowdown_bits(sample: Mapping[str, Any]) -> int:
    """NVML's harmful slowdown reasons in a stats sample, as bits of guards.HARMFUL_SLOWDOWNS."""
    return sum(1 << i for i, name in enumerate(guards.HARMFUL_SLOWDOWNS)
               if name in sample.get("gpu_throttle_reasons", ()))


def _number(value: Any) -> float | None:
    """A reported value as a float (tensors and numpy scalars too), or None when it is not one."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # not a one-element tensor: not a loss value
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
