"""Host-to-device batch copies on a side stream.

A copy issued on the compute stream when the step takes its batch waits behind that stream's
queued kernels and then holds the next step's kernels back: it never overlaps compute. Issued on
a copy stream instead, from pinned memory, it runs while the GPU is still computing the previous
step (the host queues work ahead of the GPU), and the compute stream waits for it only where the
batch is first used. ``record_stream`` tells the caching allocator the batch is used on the
compute stream, so its memory is not handed out again before those kernels ran."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Streams(Protocol):
    """The CUDA stream operations used here (a seam for testing the logic without a GPU)."""

    def new_stream(self, device: torch.device) -> Any: ...
    def use(self, stream: Any) -> Any: ...  # a context manager making ``stream`` current
    def current(self, device: torch.device) -> Any: ...
    def record(self, tensor: torch.Tensor, stream: Any) -> None: ...


class CudaStreams:
    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def use(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def current(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def record(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)


class DeviceCopier:
    """Moves the tensors of a batch (a tensor, a dict of them and other values, or a tuple) to
    ``device``; on CPU it returns the batch as it is."""

    def __init__(self, device: torch.device, streams: Streams | None = None, *, move=None):
        self.device = device
        self.streams = streams if streams is not None else (CudaStreams() if device.type == "cuda" else None)
        self.stream = self.streams.new_stream(device) if self.streams is not None else None
        self.move = move or (lambda t: t.to(device, non_blocking=True))

    def __call__(self, batch: Any) -> Any:
        if self.stream is None:
            return batch
        with self.streams.use(self.stream):
            moved = _map_tensors(batch, self.move)
        compute = self.streams.current(self.device)
        compute.wait_stream(self.stream)
        _map_tensors(moved, lambda t: self.streams.record(t, compute))
        return moved


def _map_tensors(batch: Any, fn) -> Any:
    if isinstance(batch, torch.Tensor):
        out = fn(batch)
        return batch if out is None else out
    if isinstance(batch, dict):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_map_tensors(v, fn) for v in batch)
    return batch
