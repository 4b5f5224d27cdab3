"""Proposed change for training_runtime/checkpoint.py (measured here as ``sync_proposed`` and
``async_proposed_stall``; applied by the runtime's owner).

1. ``write_checkpoint`` today pickles the state into a ``BytesIO``, copies it out with
   ``getvalue()``, hashes that copy and writes it: the state is held three times and walked four
   times. ``write_checkpoint_streaming`` lets ``torch.save`` write straight into the temporary file
   through a wrapper that updates the sha256 as bytes pass; fsyncs, manifest, atomic rename and
   the on-disk layout stay as they are.
2. The asynchronous mode today deep-copies the state into freshly allocated tensors on every save
   (``copy_to_cpu``), inside the training stall; on this machine allocating and first-touching
   that memory costs more than the copy. ``StagedCheckpointWriter`` keeps one host staging copy and
   ``copy_``s into it on later saves (the writer already waits for the previous write before a
   new save, so the staging copy is free to reuse). The background thread writes with (1).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import torch

from training_runtime.checkpoint import (
    FORMAT, MANIFEST_FILE, STATE_FILE, CheckpointWriter, copy_to_cpu, fsync_dir, prune, step_dir_name,
    write_bytes_durable)


class _HashingFile:
    """A write-only file object that hashes what it writes (``torch.save`` needs write/flush)."""

    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def write_checkpoint_streaming(root: str | os.PathLike, step: int, state: dict[str, Any]) -> Path:
    """``write_checkpoint`` with the state streamed to disk and hashed on the way."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}-{threading.get_ident()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with open(tmp / STATE_FILE, "wb") as f:
        hf = _HashingFile(f)
        torch.save(state, hf)
        f.flush()
        os.fsync(f.fileno())
    manifest = {"format": FORMAT, "step": step, "created_unix": time.time(),
                "files": {STATE_FILE: {"sha256": hf.h.hexdigest(), "num_bytes": hf.n}}}
    write_bytes_durable(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2).encode())
    fsync_dir(tmp)
    if final.exists():
        trash = root / f".trash-{final.name}-{os.getpid()}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(root)
    return final


def copy_into(staging: Any, obj: Any) -> Any:
    """``copy_to_cpu(obj)`` reusing ``staging`` (a previous result of the same structure) where
    shapes and dtypes match; anything else is copied afresh."""
    if isinstance(obj, torch.Tensor):
        if isinstance(staging, torch.Tensor) and staging.shape == obj.shape and staging.dtype == obj.dtype:
            return staging.copy_(obj.detach())
        return copy_to_cpu(obj)
    if isinstance(obj, dict):
        s = staging if isinstance(staging, dict) else {}
        return {k: copy_into(s.get(k), v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        s = staging if isinstance(staging, (list, tuple)) and len(staging) == len(obj) else [None] * len(obj)
        return type(obj)(copy_into(a, b) for a, b in zip(s, obj))
    return obj


class StagedCheckpointWriter(CheckpointWriter):
    """``CheckpointWriter`` whose async mode stages into a reused host copy; ``save`` takes the
    live state (the caller no longer calls ``copy_to_cpu``)."""

    def __init__(self, root: str, keep_last: int, async_save: bool):
        super().__init__(root, keep_last, async_save)
        self._staging: Any = None

    def _write(self, step: int, state: dict[str, Any]) -> None:
        try:
            self.last_path = write_checkpoint_streaming(self.root, step, state)
            prune(self.root, self.keep_last)
        except BaseException as e:
            self._error = e

    def save(self, step: int, state: dict[str, Any]) -> None:
        self.wait()
        if self.async_save:
            self._staging = copy_into(self._staging, state)
            self._thread = threading.Thread(target=self._write, args=(step, self._staging),
                                            name=f"ckpt-writer-{step}", daemon=False)
            self._thread.start()
        else:
            self._write(step, state)
            self._raise()
