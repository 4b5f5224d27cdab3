"""Guards: what goes wrong in a long training, detected from the figures the ranks exchange every
interval, and the hang watchdog.

Each detection is a ``Detection``: logged, sent to the orchestrator (rank 0's reporter, kind
"detection"), kept in the checkpointed history and listed in metrics.json, so the run's lineage
holds it. The checks are pure functions of the gathered per-rank figures, so every rank reaches
the same verdict from the same numbers and, when the verdict is to stop, all stop together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import logging
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# How long the watchdog waits for its report of a hang (a detection on the volume, a Pipes message).
REPORT_WAIT_S = 30.0
# NVML slowdown reasons that mean the GPU is protecting itself (heat, power delivery) or is
# failing; software power capping under full load is normal operation and is not reported.
HARMFUL_SLOWDOWNS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class Detection:
    detector: str  # "nonfinite", "loss_spike", "straggler", "data_stall", "gpu_health", "hang"
    severity: str  # "error" (the run stops) or "warning"
    step: int
    message: str
    rank: int | None = None
    host: str | None = None
    gpu: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class NonFiniteLoss(RuntimeError):
    """A non-finite loss or gradient stopped the run; the last good checkpoint is kept. A new
    attempt would repeat it (the same data and weights give the same NaN), so it is not retried."""

    def __init__(self, detection: Detection, last_good_checkpoint: str | None):
        super().__init__(detection.message)
        self.detection, self.last_good_checkpoint = detection, last_good_checkpoint


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs, for naming it in a detection."""

    host: str
    gpu: str | None


def where(places: Sequence[RankPlace] | None, rank: int) -> tuple[str | None, str | None]:
    if not places or rank >= len(places):
        return None, None
    return places[rank].host, places[rank].gpu


def _at(places: Sequence[RankPlace] | None, rank: int) -> str:
    host, gpu = where(places, rank)
    parts = [p for p in (host, gpu) if p]
    return f" ({', '.join(parts)})" if parts else ""


# ---------------------------------------------------------------- per-interval checks
def _kept(last_good: str | None, checkpoint_dir: str) -> str:
    if last_good is None:
        return f"no checkpoint was written before it (in {checkpoint_dir})"
    return f"last good checkpoint {last_good} kept in {checkpoint_dir}"


def nonfinite_detection(counts: Sequence[float], first_steps: Sequence[float], loss_counts: Sequence[float],
                        places: Sequence[RankPlace] | None, *, skipped_before: int, skip_limit: int,
                        checkpoint_dir: str, last_good: str | None = None) -> Detection | None:
    """``counts[r]``: steps of rank r in the interval with a non-finite loss or gradient;
    ``first_steps[r]``: the first of them; ``loss_counts[r]``: those where the loss itself was
    non-finite. The rank named is the first to go bad, preferring one whose own loss did (after
    the gradient exchange every rank's gradients are non-finite). Within ``skip_limit`` skipped
    batches in all, a warning; beyond it (or with no allowance) an error that stops the run,
    naming ``last_good``, the checkpoint the run is left with."""
    bad = [r for r, c in enumerate(counts) if c > 0]
    if not bad:
        return None
    rank = min(bad, key=lambda r: (first_steps[r], 0 if loss_counts[r] > 0 else 1, r))
    step = int(first_steps[rank])
    what = "loss" if loss_counts[rank] > 0 else "gradient"
    others = f" (gradients of rank(s) {[r for r in bad if r != rank]} too)" if len(bad) > 1 else ""
    total = skipped_before + int(max(counts))
    host, gpu = where(places, rank)
    if skip_limit and total <= skip_limit:
        return Detection("nonfinite", "warning", step,
                         f"non-finite {what} at step {step} on rank {rank}{_at(places, rank)}{others}: "
                         f"batch skipped ({total} of at most {skip_limit})", rank, host, gpu)
    allowance = (f", after skipping {skipped_before} batch(es), the most guards.nonfinite_skip_batches allows"
                 if skip_limit else "")
    return Detection("nonfinite", "error", step,
                     f"non-finite {what} at step {step} on rank {rank}{_at(places, rank)}{others}{allowance}; "
                     f"training stopped; {_kept(last_good, checkpoint_dir)}. "
                     "Lower recipe.lr, clip gradients (recipe.grad_clip_norm), check the data for bad values, or let "
                     "guards.nonfinite_skip_batches skip a few such batches", rank, host, gpu)


def reported_nonfinite_detection(step: int, key: str, value: Any, rank: int, places: Sequence[RankPlace] | None, *,
                                 checkpoint_dir: str, last_good: str | None) -> Detection:
    """A training function reported a non-finite ``key`` (its loss) at ``step``: the run stops."""
    host, gpu = where(places, rank)
    what = "loss" if key == "loss" else f"loss ({key})"
    return Detection("nonfinite", "error", step,
                     f"non-finite {what} at step {step} on rank {rank}{_at(places, rank)}: ctx.report got "
                     f"{key}={value}; training stopped; "
                     f"{_kept(last_good, checkpoint_dir)}. Lower the learning rate, clip gradients, check the data "
                     "for bad values, or skip such batches in the training function before reporting", rank, host, gpu)


def interval_mean_loss(loss_sums: Sequence[float], loss_steps: Sequence[float]) -> float:
    """An interval's mean loss per step over every rank. ``loss_sums[r]``: rank r's summed loss of
    the steps it counted, ``loss_steps[r]``: how many; a batch skipped for a non-finite loss or
    gradient (guards.nonfinite_skip_batches) is in neither, so it leaves out that step alone, not
    the rank's whole interval. NaN when no step counted (every batch of the interval skipped)."""
    counted = sum(loss_steps)
    return sum(loss_sums) / counted if counted else float("nan")


def loss_spike_detection(step: int, loss: float, recent: Sequence[float], factor: float | None) -> Detection | None:
    """The interval's loss above ``factor`` x the median of the recent intervals' losses."""
    if factor is None or len(recent) < 3:
        return None
    median = statistics.median(recent)
    if median > 0 and loss > factor * median:
        return Detection("loss_spike", "warning", step,
                         f"loss spike at step {step}: {loss:.4g} is {loss / median:.1f}x the median {median:.4g} of "
                         f"the last {len(recent)} intervals (guards.loss_spike_factor {factor})")
    return None


def straggler_detection(step: int, per_rank_s: Sequence[float], places: Sequence[RankPlace] | None, *,
                        factor: float, min_excess_s: float) -> Detection | None:
    """``per_rank_s``: each rank's mean compute time per step (forward and loss, before any
    collective, so peers' waiting does not even it out) over the window."""
    if len(per_rank_s) < 2:
        return None
    median = statistics.median(per_rank_s)
    rank = max(range(len(per_rank_s)), key=lambda r: per_rank_s[r])
    slow = per_rank_s[rank]
    if slow > factor * median and slow - median > min_excess_s:
        host, gpu = where(places, rank)
        return Detection("straggler", "warning", step,
                         f"rank {rank}{_at(places, rank)} is a straggler: {slow * 1000:.1f} ms of compute per step "
                         f"against a median of {median * 1000:.1f} ms ({slow / max(median, 1e-12):.1f}x, guards."
                         f"straggler_factor {factor}); every rank waits for it at each gradient exchange",
                         rank, host, gpu)
    return None


def data_stall_detection(step: int, wait_share: Sequence[float], places: Sequence[RankPlace] | None, *,
                         threshold: float, loader_threads: int, prefetch_batches: int,
                         wait_per_step_s: Sequence[float], min_wait_s: float) -> Detection | None:
    """A warning when a rank spent more than ``threshold`` of its step time waiting for batches
    and more than ``min_wait_s`` a step (the one with the largest share is named): a few
    milliseconds of scheduling noise on millisecond steps is a large share and no stall."""
    stalled = [r for r in range(len(wait_share)) if wait_share[r] > threshold and wait_per_step_s[r] > min_wait_s]
    if not stalled:
        return None
    rank = max(stalled, key=lambda r: wait_share[r])
    share = wait_share[rank]
    host, gpu = where(places, rank)
    return Detection("data_stall", "warning", step,
                     f"data stall: rank {rank}{_at(places, rank)} waited for batches {share:.0%} of its step time "
                     f"(guards.data_stall_share {threshold:.0%}); raise recipe.loader_threads (now {loader_threads}) "
                     f"or recipe.prefetch_batches (now {prefetch_batches}), or move the shards to faster storage",
                     rank, host, gpu)


def gpu_health_detections(step: int, temperatures: Sequence[float], slowdowns: Sequence[Sequence[str]],
                          places: Sequence[RankPlace] | None, *, max_temperature_c: float) -> list[Detection]:
    """Hot GPUs and harmful NVML slowdown reasons (thermal, power brake, hardware slowdown)."""
    out = []
    for rank, (temp, reasons) in enumerate(zip(temperatures, slowdowns)):
        harmful = [r for r in reasons if r in HARMFUL_SLOWDOWNS]
        problems = []
        if temp >= max_temperature_c:
            problems.append(f"{temp:.0f} C (guards.gpu_max_temperature_c {max_temperature_c:.0f})")
        if harmful:
            problems.append("clocks slowed: " + ", ".join(harmful))
        if problems:
            host, gpu = where(places, rank)
            out.append(Detection("gpu_health", "warning", step,
                                 f"GPU of rank {rank}{_at(places, rank)}: {'; '.join(problems)}", rank, host, gpu))
    return out


class WindowedTimes:
    """Per-rank sums over the last ``window`` intervals."""

    def __init__(self, world_size: int, window: int):
        self.entries: deque[tuple[list[float], int]] = deque(maxlen=window)
        self.world_size = world_size

    def add(self, per_rank_s: Sequence[float], steps: int) -> None:
        self.entries.append((list(per_rank_s), steps))

    def mean_per_step(self) -> list[float]:
        steps = sum(s for _, s in self.entries)
        return [sum(e[0][r] for e in self.entries) / max(1, steps) for r in range(self.world_size)]


# ---------------------------------------------------------------- the hang watchdog
def kill_stopped_siblings() -> list[int]:
    """SIGKILL the stopped (SIGSTOP, T state) worker processes beside this one under torchrun's
    agent. A stopped peer cannot act on the agent's SIGTERM, so the agent would wait out its grace
    period before killing it; the restart starts at once instead. Running peers are left to the
    agent."""
    import psutil

    killed = []
    try:
        me = psutil.Process()
        parent = me.parent()
        siblings = parent.children() if parent is not None else []
    except psutil.Error:
        return killed
    for proc in siblings:
        try:
            if proc.pid != me.pid and proc.status() == psutil.STATUS_STOPPED:
                proc.kill()
                killed.append(proc.pid)
        except psutil.Error:  # gone meanwhile
            continue
    return killed


STACK_CHARS = 6000  # of a hang's stacks kept in its record: the innermost frames of each thread


def thread_stacks(skip: int | None = None, limit: int = STACK_CHARS) -> str:
    """Every thread's Python stack but ``skip``'s (an ident: the watchdog's own), main thread first,
    each cut to its innermost frames so that all threads fit in ``limit`` characters."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sorted(((ident, frame) for ident, frame in sys._current_frames().items() if ident != skip),
                    key=lambda item: item[0] != threading.main_thread().ident)
    if not frames:
        return ""
    share = max(400, limit // len(frames))
    parts = []
    for ident, frame in frames:
        lines = traceback.format_stack(frame)
        text, kept = "", 0
        for line in reversed(lines):  # innermost first, then outward while it fits
            if len(text) + len(line) > share:
                break
            text, kept = line + text, kept + 1
        cut = f"  ... {len(lines) - kept} outer frame(s) left out\n" if kept < len(lines) else ""
        parts.append(f"Thread {names.get(ident, ident)!s} (most recent call last):\n{cut}{text}")
    return "".join(parts)[:limit]


class HangWatchdog:
    """Fails this rank when no training step finishes for ``timeout_s``: every thread's Python
    stack goes to stderr (faulthandler), a detection is reported, and the process exits, so
    torchrun tears the attempt down and a restart resumes from the last checkpoint. Long phases
    that are not steps (validation, checkpoint writes, the first step's compilation) run with
    the watchdog paused: they have their own timeouts."""

    def __init__(self, timeout_s: float | None, rank: int, on_hang: Callable[[Detection], None] | None = None,
                 exit: Callable[[int], None] = os._exit, clock: Callable[[], float] = time.monotonic,
                 poll_s: float | None = None):
        self.timeout_s, self.rank = timeout_s, rank
        self.on_hang, self.exit, self.clock = on_hang, exit, clock
        self.poll_s = poll_s if poll_s is not None else (min(5.0, timeout_s / 10) if timeout_s else 1.0)
        self.last_beat, self.last_step = clock(), 0
        self.armed = False  # by the first beat: the first step (compilation, warm-up) is not timed
        self.pauses = 0
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.fired: Detection | None = None
        self.stacks: str | None = None  # every other thread's Python stack when it fired

    def start(self) -> None:
        if self.timeout_s is None or self.thread is not None:
            return
        self.thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self.thread.start()

    def beat(self, step: int) -> None:
        with self.lock:
            self.last_beat, self.last_step, self.armed = self.clock(), step, True

    @contextlib.contextmanager
    def paused(self):
        with self.lock:
            self.pauses += 1
        try:
            yield
        finally:
            with self.lock:
                self.pauses -= 1
                self.last_beat = self.clock()

    def check(self) -> Detection | None:
        """One look (the thread calls it every poll; tests call it directly)."""
        with self.lock:
            if self.timeout_s is None or not self.armed or self.pauses:
                return None
            idle = self.clock() - self.last_beat
            if idle < self.timeout_s:
                return None
            step = self.last_step
        detection = Detection("hang", "error", step,
                              f"hang: rank {self.rank} finished no training step for {idle:.0f} s after step {step} "
                              f"(guards.hang_timeout_s {self.timeout_s:g}); a peer is stalled, dead or deadlocked. "
                              "Stacks of every thread follow; the attempt fails and is retried: a restart resumes "
                              "from the last checkpoint", self.rank)
        self.fired = detection
        return detection

    def _watch(self) -> None:
        while not self.stop_event.wait(self.poll_s):
            detection = self.check()
            if detection is None:
                continue
            print(f"[rank{self.rank}] {detection.message}", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            # The same stacks as text for the attempt's records, which the orchestrator shows in
            # the run's event log (stderr reaches only the rank's log file).
            self.stacks = thread_stacks(skip=threading.get_ident())
            if self.on_hang is not None:
                self._report(detection)
            for pid in kill_stopped_siblings():
                print(f"[rank{self.rank}] killed stopped peer process {pid}", file=sys.stderr, flush=True)
            sys.stderr.flush()
            self.exit(1)
            return

    def _report(self, detection: Detection) -> None:
        """``on_hang`` in a thread of its own, waited for at most ``REPORT_WAIT_S``: what hangs may be
        the very volume or channel the report goes to, and the exit must happen all the same."""
        def report() -> None:
            try:
                self.on_hang(detection)
            except Exception as e:  # the exit must happen whatever reporting does; the reason is printed
                print(f"[rank{self.rank}] reporting the hang failed: {e}", file=sys.stderr, flush=True)

        reporter = threading.Thread(target=report, name="hang-report", daemon=True)
        reporter.start()
        reporter.join(timeout=REPORT_WAIT_S)
        if reporter.is_alive():
            print(f"[rank{self.rank}] reporting the hang took over {REPORT_WAIT_S:g} s; exiting without it",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
