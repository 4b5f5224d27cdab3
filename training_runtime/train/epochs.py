"""What the context hands a training loop step by step: one epoch's batches (telling the guards
of each before it is handed out) and the SIGTERM flag that asks it to stop."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import torch

from training_runtime.data.batches import model_batches


class StopSignal:
    """SIGTERM (what Kubernetes and torchrun send before a kill) sets a flag instead of ending the
    process, so training can save a checkpoint first."""

    def __init__(self) -> None:
        self.requested = False
        try:
            signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread (tests drive a context from a thread): no handler
            pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True


class EpochBatches:
    """One epoch's model batches; ``wait_s`` is the time spent waiting for them. ``on_batch(step,
    wait_s)`` hears of each before it is handed out (its global step, 1-based, and the wait for it)."""

    def __init__(self, loader, info, first_step: int = 0,
                 on_batch: Callable[[int, float], None] | None = None):
        self.loader, self.info, self.first_step, self.on_batch = loader, info, first_step, on_batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        step, seen = self.first_step, self.loader.wait_s
        for batch in model_batches(self.loader, self.info):
            step += 1
            if self.on_batch is not None:
                wait, seen = self.loader.wait_s - seen, self.loader.wait_s
                self.on_batch(step, wait)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def wait_s(self) -> float:
        return self.loader.wait_s
