"""Test hooks that inject faults into a real training, read from the environment in one place.

``TRAINING_RUNTIME_FAULT_KILL_AT_STEP=RANK:STEP`` makes rank RANK SIGKILL itself after optimizer
step STEP on the first attempt (to exercise ``torchrun --max-restarts``); ``RANK:STEP:checkpoint``
kills it inside the write of checkpoint STEP instead, after the state file is on disk and before
the checkpoint is published (rank 0 writes checkpoints); ``RANK:STEP:checkpoint-node`` kills its
torchrun agent too, as when the node is lost mid-write.
``TRAINING_RUNTIME_FAULT_SLOW_RANK=RANK:SECONDS`` makes a rank sleep before each forward (a
straggler; for a training function: once it has the batch), ``TRAINING_RUNTIME_FAULT_SLOW_LOADER=SECONDS``
every batch load (a data stall) and
``TRAINING_RUNTIME_FAULT_STOP_AT_STEP=RANK:STEP`` a rank SIGSTOP itself on the first attempt (a
hang). The built-in trainer checks after each optimizer step, a training function's context after
each ``ctx.report``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from training_runtime.config import ConfigError

FAULT_ENV = "TRAINING_RUNTIME_FAULT_KILL_AT_STEP"
SLOW_RANK_ENV = "TRAINING_RUNTIME_FAULT_SLOW_RANK"  # RANK:SECONDS slept before each forward (a straggler)
SLOW_LOADER_ENV = "TRAINING_RUNTIME_FAULT_SLOW_LOADER"  # SECONDS slept in each batch load (a data stall)
STOP_ENV = "TRAINING_RUNTIME_FAULT_STOP_AT_STEP"  # RANK:STEP: the rank SIGSTOPs itself on attempt 0 (a hang)


@dataclass(frozen=True)
class FaultInjection:
    """Rank ``rank`` SIGKILLs itself right after optimizer step ``step`` on the first attempt
    (TORCHELASTIC_RESTART_COUNT 0), so a restarted attempt runs through. With
    ``in_checkpoint_write`` the kill comes inside the write of checkpoint ``step`` instead: the
    state file is on disk, the checkpoint is not yet published."""

    rank: int = -1
    step: int = -1
    in_checkpoint_write: bool = False
    whole_node: bool = False  # the kill takes the rank's torchrun agent too: the node is lost
    slow_rank: int | None = None  # this rank sleeps slow_rank_s before each forward (a straggler)
    slow_rank_s: float = 0.0
    slow_loader_s: float = 0.0  # every batch load sleeps this long (a data stall)
    stop_rank: int | None = None  # this rank SIGSTOPs itself after step stop_step on attempt 0 (a hang)
    stop_step: int = -1

    def kill_mid_step(self, rank: int, step: int, restart_count: int) -> bool:
        return not self.in_checkpoint_write and restart_count == 0 and rank == self.rank and step == self.step

    def kill_in_checkpoint_write(self, rank: int, step: int, restart_count: int) -> bool:
        return self.in_checkpoint_write and restart_count == 0 and rank == self.rank and step == self.step

    def after_step(self, rank: int, step: int, restart_count: int) -> None:
        """Kill or stop this process when the hook says so for ``step``."""
        if self.kill_mid_step(rank, step, restart_count):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.stop_rank == rank and self.stop_step == step and restart_count == 0:
            os.kill(os.getpid(), signal.SIGSTOP)

    def slow_down(self, rank: int) -> None:
        if self.slow_rank == rank:
            time.sleep(self.slow_rank_s)  # this rank's own work takes longer

    def checkpoint_hook(self, rank: int, restart_count: int) -> Callable[[int], None] | None:
        """The checkpoint writer's callback (None without an in-write fault)."""
        if not self.in_checkpoint_write:
            return None

        def kill_if_due(step: int) -> None:
            if self.kill_in_checkpoint_write(rank, step, restart_count):
                if self.whole_node:  # the node is lost: its torchrun agent first, then this rank
                    os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
        return kill_if_due


def delayed(load: Callable, seconds: float) -> Callable:
    def slow_load(batches):
        time.sleep(seconds)
        return load(batches)

    return slow_load


def fault_from_env(environ: Mapping[str, str] | None = None) -> FaultInjection | None:
    environ = os.environ if environ is None else environ
    kill, slow_rank, slow_loader, stop = (environ.get(k) for k in (FAULT_ENV, SLOW_RANK_ENV, SLOW_LOADER_ENV,
                                                                    STOP_ENV))
    if not (kill or slow_rank or slow_loader or stop):
        return None
    fields: dict = {}
    if kill:
        rank, _, rest = kill.partition(":")
        step, _, where = rest.partition(":")
        if not (rank.isdigit() and step.isdigit()) or where not in ("", "checkpoint", "checkpoint-node"):
            raise ConfigError(f"{FAULT_ENV} must be 'RANK:STEP', 'RANK:STEP:checkpoint' or "
                              f"'RANK:STEP:checkpoint-node', got {kill!r}")
        fields.update(rank=int(rank), step=int(step), in_checkpoint_write=where.startswith("checkpoint"),
                      whole_node=where == "checkpoint-node")
    try:
        if slow_rank:
            rank, _, seconds = slow_rank.partition(":")
            fields.update(slow_rank=int(rank), slow_rank_s=float(seconds))
        if slow_loader:
            fields.update(slow_loader_s=float(slow_loader))
        if stop:
            rank, _, step = stop.partition(":")
            fields.update(stop_rank=int(rank), stop_step=int(step))
    except ValueError as e:
        raise ConfigError(f"{SLOW_RANK_ENV} must be 'RANK:SECONDS', {SLOW_LOADER_ENV} 'SECONDS' and {STOP_ENV} "
                          f"'RANK:STEP': {e}") from e
    return FaultInjection(**fields)
