"""A model's weights written as ``model.safetensors`` one tensor at a time, from a sharded (FSDP)
or a replicated model, without the whole model in one rank's memory.

``safetensors.torch.save_file`` takes a dict of whole CPU tensors and copies each into bytes
before it writes, and the model card's ``_storable`` clones them first; with FSDP's full state
dict gathered on rank 0 beside them, rank 0 held the model three times over at the final save
(the issue's 2.5 GB for a 577 MB model). Here every rank walks the state dict in the file's
order; a parameter sharded as a DTensor is all-gathered alone (``full_tensor``: a collective,
so every rank takes the same tensors in the same order), rank 0 writes its bytes straight from
the tensor's memory and drops it. The peak is the rank's own shard plus the largest tensor.

The bytes are the ones ``save_file`` writes for the same tensors: the tensor order and the
header are safetensors' own, read from ``safetensors.torch.save`` of one-element stand-ins (its
order depends on dtype and name only); tests/distributed/test_fsdp_save.py compares the two.
Tied weights are stored once, as the model card records them (``shared``).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training_runtime.atomic_files import atomic_path


def _is_dtensor(t: Any) -> bool:
    return hasattr(t, "full_tensor") and hasattr(t, "to_local")


def _identity(t: torch.Tensor) -> tuple | None:
    """What makes two state-dict entries the same tensor (tied weights); None for empty ones.
    The storage, never ``id()``: ``state_dict()`` detaches every entry into a new object (a
    DTensor too), so ids neither find ties nor stay unique once a temporary is freed. A DTensor
    is keyed by its local shard's storage and its global shape: tied parameters are one FSDP
    parameter, so their shards share storage."""
    local = t.to_local() if _is_dtensor(t) else t
    if not local.numel() or not t.numel():
        return None
    return (local.device.type, local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape),
            tuple(local.stride()), local.dtype, tuple(t.shape))


def stored_and_shared(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The entries to store, and ``{name: stored name}`` for tied weights (the first name of a
    tensor is stored, later ones refer to it); ``serve.card._storable`` decides by it too.

    With DTensors under a process group this is rank 0's decision, broadcast: every rank must
    gather the same tensors in the same order, and a rank whose shard of a tensor is empty cannot
    see its ties (rank 0's shard of a non-empty tensor never is)."""
    shared: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = _identity(tensor.detach())
        if key is not None and key in seen:
            shared[name] = seen[key]
        elif key is not None:
            seen[key] = name
    if any(_is_dtensor(t) for t in state.values()):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            box = [shared]
            dist.broadcast_object_list(box, src=0)
            shared = box[0]
    stored = {name: tensor.detach() for name, tensor in state.items() if name not in shared}
    return stored, shared


def safetensors_layout(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> tuple[bytes, list[str]]:
    """(the file's first bytes: header length and header, the names in the order of their data)
    for ``tensors`` (whole or DTensor: only names, dtypes and global shapes are read)."""
    from safetensors.torch import save

    probe = save({n: torch.zeros(1, dtype=t.dtype) for n, t in tensors.items()}, metadata=dict(metadata))
    (length,) = struct.unpack("<Q", probe[:8])
    order = [k for k in json.loads(probe[8:8 + length]) if k != "__metadata__"]
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {"dtype": json.loads(probe[8:8 + length])[name]["dtype"], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text, order


def _write_all(f, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += f.write(data[done:])


def write_safetensors(path: str | Path, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str], *,
                      writer: bool) -> tuple[dict[str, str], str | None]:
    """Collective when ``state`` holds DTensors (call on every rank). ``writer`` (rank 0) writes
    ``path`` atomically; returns (``shared`` tied-weight names, the file's sha256 on the writer,
    None elsewhere). Each sharded tensor is gathered, written and dropped before the next."""
    stored, shared = stored_and_shared(state)
    head, order = safetensors_layout(stored, metadata)
    digest = hashlib.sha256(head) if writer else None
    with atomic_path(path) if writer else _nowhere() as tmp:
        f = open(tmp, "wb", buffering=0) if writer else None
        try:
            if f is not None:
                _write_all(f, memoryview(head))
            for name in order:
                t = stored[name]
                whole = _gathered(t) if _is_dtensor(t) else t  # the collective, on every rank
                if f is not None and whole.numel():
                    data = whole.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
                    view = memoryview(data)
                    digest.update(view)
                    _write_all(f, view)
                del whole
        finally:
            if f is not None:
                f.close()
    return shared, digest.hexdigest() if digest is not None else None


def _gathered(t: torch.Tensor) -> torch.Tensor:
    """The whole of DTensor ``t``, waited for on this rank. ``full_tensor`` hands back an
    asynchronous result; a rank that does not use it (all but the writer) would otherwise race
    ahead, issuing one all-gather after another while the writer is still writing, and gloo's
    worker threads then paired buffers of different tensors ("Received data size doesn't match
    expected size", seen with a 151M-parameter model of 24 units on 2 ranks)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    whole = t.full_tensor()
    return whole.wait() if isinstance(whole, AsyncCollectiveTensor) else whole


class _nowhere:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------- stored weights
@dataclass(frozen=True)
class StoredWeights:
    """A ``model.safetensors`` already written (the best validation's, under FSDP): the model's
    final save copies it instead of gathering the weights again."""

    path: Path
    shared: dict[str, str]


def copy_file(src: Path, dst: Path) -> str:
    """Copy in blocks, hashing beside; the sha256 of the bytes copied."""
    h = hashlib.sha256()
    with atomic_path(dst) as tmp, open(src, "rb") as fi, open(tmp, "wb") as fo:
        while block := fi.read(8 << 20):
            h.update(block)
            fo.write(block)
    return h.hexdigest()


def write_weights_checkpoint(root: str | Path, step: int, state: dict[str, Any], weights: Mapping[str, torch.Tensor],
                             *, writer: bool, file_name: str, metadata: Mapping[str, str]) -> Path | None:
    """Collective under FSDP. A checkpoint (``checkpoint.full``'s layout: atomic, with a sha256
    manifest, found by ``find_latest_valid``) holding ``model.safetensors`` streamed from
    ``weights`` as ``file_name`` with safetensors ``metadata`` (the model card's, so the final
    save can copy it) and the small ``state`` (which records the file and its tied weights); the
    writer's published directory, None elsewhere. The best validation's weights under FSDP:
    never gathered whole, and the model's final save copies the file."""
    import os
    import time

    from training_runtime.atomic_files import fsync_path, replace_durably
    from training_runtime.checkpoint import full as ckpt

    root = Path(root)
    tmp = root / f".tmp-{ckpt.step_dir_name(step)}-weights-{os.getpid()}"
    if writer:
        root.mkdir(parents=True, exist_ok=True)
        ckpt.remove_stale_temporaries(root)
        tmp.mkdir()
    shared, sha = write_safetensors(tmp / file_name, weights, metadata, writer=writer)
    if not writer:
        return None
    files = {file_name: {"sha256": sha, "num_bytes": (tmp / file_name).stat().st_size},
             ckpt.STATE_FILE: ckpt.save_hashed(tmp / ckpt.STATE_FILE, {**state, WEIGHTS_KEY: file_name,
                                                                        "shared": shared})}
    fsync_path(tmp / ckpt.STATE_FILE)
    manifest = {"format": ckpt.FORMAT, "step": step, "created_unix": time.time(), "files": files}
    (tmp / ckpt.MANIFEST_FILE).write_bytes(json.dumps(manifest, indent=2).encode())
    fsync_path(tmp / ckpt.MANIFEST_FILE)
    fsync_path(tmp)
    final = root / ckpt.step_dir_name(step)
    if final.exists():
        ckpt.discard(final)
    replace_durably(tmp, final)
    return final


WEIGHTS_KEY = "weights_file"  # in a weights checkpoint's state.pt: the safetensors file beside it


def stored_weights(path: Path, state: dict[str, Any]) -> StoredWeights | None:
    """The weights file of a checkpoint written by ``write_weights_checkpoint``, or None for a
    checkpoint that holds its weights in ``state['model']``."""
    if WEIGHTS_KEY not in state:
        return None
    return StoredWeights(Path(path) / state[WEIGHTS_KEY], dict(state.get("shared") or {}))
