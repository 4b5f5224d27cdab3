"""Exchanging each rank's interval figures without stalling the GPU.

Reading a device tensor on the host (``.cpu()``, ``.item()``) waits for every kernel queued
before it, so a telemetry read every N steps would drain the CUDA queue N steps at a time and
the GPU would idle while the host refills it. Here the figures of an interval are packed on the
device (the loss sum never leaves it), all-gathered asynchronously, and copied to pinned host
memory on a side stream that waits only for the gather; the host reads them one interval later,
when the copy has long finished. On CPU (gloo) the same calls run, and a read just waits for the
gather.

GPU time per interval comes from CUDA events recorded around the interval's steps, read once the
later event has completed (host wall-clock time only measures how fast the host queued the
work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class IntervalTimer:
    """CUDA events around an interval's steps; ``None`` figures on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.start: Any = None
        self.end: Any = None

    def mark_start(self) -> None:
        if self.cuda and self.start is None:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def mark_end(self) -> None:
        if self.cuda and self.start is not None:
            self.end = torch.cuda.Event(enable_timing=True)
            self.end.record()

    def elapsed_s(self) -> float | None:
        """GPU seconds between the marks, once the end has run (waits for it if it has not: by
        the next interval it has, unless the host ran a whole interval ahead of the GPU)."""
        if self.start is None or self.end is None:
            return None
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1000.0


@dataclass
class PendingGather:
    """An all-gather in flight; ``read()`` gives every rank's row of figures as floats."""

    work: Any
    outputs: list[torch.Tensor]
    host: torch.Tensor | None = None  # pinned copy (CUDA)
    copied: Any = None  # CUDA event after the copy
    meta: dict[str, Any] | None = None  # what the caller needs to process the figures

    def read(self) -> list[list[float]]:
        if self.copied is not None:
            self.copied.synchronize()
            return self.host.tolist()
        self.work.wait()
        return torch.stack(self.outputs).tolist()


class IntervalGather:
    """All-gathers a float64 vector per rank without a host-device synchronisation."""

    def __init__(self, device: torch.device, world_size: int, group: Any = None):
        self.device, self.world_size, self.group = device, world_size, group
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def pack(self, on_device: list[torch.Tensor], host_values: list[float]) -> torch.Tensor:
        """One float64 vector: device scalars (kept on the device) then host numbers (copied from
        pinned memory without blocking: a pageable copy would synchronise the stream)."""
        host = torch.tensor(host_values, dtype=torch.float64)
        if self.side is not None:
            host = host.pin_memory().to(self.device, non_blocking=True)
        parts = [t.detach().to(torch.float64).reshape(1) for t in on_device]
        return torch.cat([*parts, host])

    def launch(self, mine: torch.Tensor, meta: dict[str, Any] | None = None) -> PendingGather:
        outputs = [torch.empty_like(mine) for _ in range(self.world_size)]
        work = dist.all_gather(outputs, mine, group=self.group, async_op=True)
        pending = PendingGather(work, outputs, meta=meta)
        if self.side is not None:
            with torch.cuda.stream(self.side):
                work.wait()  # the side stream (not the host, not the compute stream) waits for it
                for t in outputs:
                    t.record_stream(self.side)  # made on the compute stream, read on this one
                stacked = torch.stack(outputs)
                pending.host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
                pending.host.copy_(stacked, non_blocking=True)
                pending.copied = torch.cuda.Event()
                pending.copied.record(self.side)
        return pending
