"""The async writer's host copy of a checkpoint's state, and the copy deferred past the save.

An async save must copy the state before training changes it, but training does not change all
of it at once. Parameters and optimizer state (AdamW's moments and step counts, most of a
checkpoint's bytes) change only in the optimizer's step; the forward and backward in between
read them and write only activations and gradients. So those tensors are copied by a
background thread while the next forward and backward run, and the optimizer's next step waits
for that copy (an optimizer step pre-hook): the same pattern as torch.distributed.checkpoint's
async stager, whose ``synchronize_staging`` a training loop calls before its next step. Every
other tensor (buffers such as batch norm's running statistics, which a forward updates in
place; anything the optimizer does not own) is copied during the save, as before.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch


def copy_to_cpu(obj: Any) -> Any:
    """Deep copy with every tensor cloned into host memory, so training may go on mutating the
    originals while a background thread writes the copy."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        return {k: copy_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(copy_to_cpu(v) for v in obj)
    return obj


def _storage(t: torch.Tensor) -> tuple[str, int] | None:
    try:
        return str(t.device), t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a layout without one storage (sparse): copied at once
        return None


def optimizer_storages(optimizer: torch.optim.Optimizer) -> frozenset[tuple[str, int]]:
    """The memory only ``optimizer``'s step writes: its parameters' and its state's tensors."""
    owned = [p for g in optimizer.param_groups for p in g["params"]]
    owned += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return frozenset(k for k in map(_storage, owned) if k is not None)


def copy_into(staging: Any, obj: Any, defer: frozenset[tuple[str, int]] = frozenset(),
              deferred: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """``copy_to_cpu(obj)`` that reuses the tensors of ``staging`` (an earlier result for the same
    structure) where shape and dtype match, so repeated saves do not allocate and first-touch new
    host memory inside the training stall. Tensors whose memory is in ``defer`` are not copied
    yet: their (host copy, source) pairs are appended to ``deferred`` for ``finish_copies``."""
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        later = deferred is not None and _storage(src) in defer
        if isinstance(staging, torch.Tensor) and staging.shape == src.shape and staging.dtype == src.dtype:
            dst = staging
        elif later:
            dst = torch.empty(src.shape, dtype=src.dtype, device="cpu")
        else:
            return copy_to_cpu(src)
        if later:
            deferred.append((dst, src))
            return dst
        return dst.copy_(src)
    if isinstance(obj, dict):
        s = staging if isinstance(staging, dict) else {}
        return {k: copy_into(s.get(k), v, defer, deferred) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        s = staging if isinstance(staging, (list, tuple)) and len(staging) == len(obj) else [None] * len(obj)
        return type(obj)(copy_into(a, b, defer, deferred) for a, b in zip(s, obj))
    return obj


class DeferredCopy:
    """Copies still owed to one save's host copy, made by the writer's thread (``run``), and the
    fence that holds ``optimizer``'s next step until they are made. ``waited_s`` is how long that
    step waited: the part of the save's stall that falls inside training."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], optimizer: torch.optim.Optimizer):
        self.pairs = pairs
        self.done = threading.Event()
        self.waited_s = 0.0
        self.error: BaseException | None = None
        self._hook = optimizer.register_step_pre_hook(lambda *_: self.wait())

    def run(self) -> None:
        """On the writer's thread: make the copies (``copy_`` releases the GIL), then open the fence
        whatever happened, so a failed copy fails the checkpoint, never hangs training."""
        try:
            for dst, src in self.pairs:
                dst.copy_(src)
        except BaseException as e:
            self.error = e
            raise
        finally:
            self.done.set()

    def wait(self) -> None:
        """Until the copies are made (the optimizer's step pre-hook, and the writer's ``wait``)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if not self.done.is_set():
            t0 = time.perf_counter()
            self.done.wait()
            self.waited_s += time.perf_counter() - t0
