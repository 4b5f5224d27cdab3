"""Sharded checkpoints for FSDP/HSDP (``checkpoint.format`` 'sharded').

The full format gathers the whole model and optimizer state on rank 0, which writes one file,
and every rank reads that whole file back on resume: host memory for the full state on every
rank. Here every rank writes only the shards it holds with torch.distributed.checkpoint (DCP)
and reads back only the ones it needs, at whatever world size the resuming run has (DCP
reshards by parameter name and offset).

Layout and guarantees are those of ``checkpoint.py``: the ranks write into one hidden temporary
step directory (``dcp/__<rank>_*.distcp`` from each rank, ``dcp/.metadata`` and ``state.pt``, the
trainer's small state, from rank 0); each rank hashes its own files, rank 0 collects the
hashes into ``manifest.json`` (format ``SHARDED_FORMAT``) and renames the directory into place.
So ``find_latest_valid`` verifies every shard's sha256 before a resume, skips a damaged
checkpoint for the previous one, and ``prune`` keeps the newest ``keep_last`` of either format.

All waits on another rank's I/O go through the gloo I/O group (its long timeout), as DCP's own
coordination does here: it only exchanges plans and small objects, never tensors.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from training_runtime.atomic_files import fsync_path, replace_durably
from training_runtime.checkpoint import full as ckpt
from training_runtime.distributed.process_group import DistInfo, all_gather_object, raise_if_any_failed

DCP_DIR = "dcp"
DCP_METADATA = ".metadata"


def temporary_dir(root: Path, step: int) -> Path:
    """The step's temporary directory, the same name on every rank (no exchange needed)."""
    return root / f".tmp-{ckpt.step_dir_name(step)}-sharded"


def rank_files(dcp_dir: Path, rank: int) -> list[Path]:
    """The files rank ``rank`` wrote: DCP's FileSystemWriter prefixes them ``__<rank>_``; rank 0 also
    writes the global ``.metadata``."""
    own = sorted(dcp_dir.glob(f"__{rank}_*"))
    if rank == 0 and (dcp_dir / DCP_METADATA).is_file():
        own.append(dcp_dir / DCP_METADATA)
    return own


def file_entry(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return {"sha256": h.hexdigest(), "num_bytes": path.stat().st_size}


def _state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's sharded model and optimizer state (DTensors under FSDP), keyed by parameter
    name. A fresh optimizer's state is initialised first, so a load has tensors to fill."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def save_sharded(root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 state: dict[str, Any], info: DistInfo, *, keep_last: int,
                 before_publish: Callable[[int], None] | None = None) -> Path:
    """Collective. Every rank writes its shards of ``model`` and ``optimizer``; rank 0 writes
    ``state`` (small: step, schedule, history, RNGs, config) as ``state.pt``, the sha256 manifest
    of every file, publishes the checkpoint atomically and prunes to ``keep_last``. Returns the
    published directory. ``before_publish(step)`` runs on every rank once its shards are on disk
    (the fault-injection tests kill a rank there)."""
    import torch.distributed.checkpoint as dcp

    root = Path(root)
    tmp, final = temporary_dir(root, step), root / ckpt.step_dir_name(step)
    err = None
    if info.is_main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by a killed attempt
                shutil.rmtree(tmp)
            tmp.mkdir()
        except Exception as e:  # re-raised on every rank below
            err = e
    raise_if_any_failed(err, f"creating {tmp}", info.io_group)  # also: nobody writes before it is empty
    dcp.save(_state_dicts(model, optimizer), storage_writer=dcp.FileSystemWriter(tmp / DCP_DIR, sync_files=True),
             process_group=info.io_group)
    if before_publish is not None:
        before_publish(step)
    # Each rank hashes what it wrote (in parallel, from its page cache) rather than rank 0
    # reading every shard back.
    mine = {str(p.relative_to(tmp)): file_entry(p) for p in rank_files(tmp / DCP_DIR, info.rank)}
    hashes = all_gather_object(mine, group=info.io_group)
    err = None
    if info.is_main:
        try:
            _publish(tmp, final, step, state, hashes)
            ckpt.prune(root, keep_last)
        except Exception as e:
            err = e
    raise_if_any_failed(err, f"publishing sharded checkpoint {final}", info.io_group)
    return final


def _publish(tmp: Path, final: Path, step: int, state: dict[str, Any], hashes: list[dict[str, Any]]) -> None:
    """Rank 0: the state file, the manifest of every file, the atomic rename."""
    files: dict[str, Any] = {}
    for part in hashes:
        files.update(part)
    files[ckpt.STATE_FILE] = ckpt.save_hashed(tmp / ckpt.STATE_FILE, state)
    fsync_path(tmp / ckpt.STATE_FILE)
    present = {str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()}
    for name in sorted(present - set(files)):  # a file under a name no rank claimed: hashed here
        files[name] = file_entry(tmp / name)
    missing = set(files) - present
    if missing:
        raise RuntimeError(f"sharded checkpoint {tmp} lacks {sorted(missing)} after every rank wrote its shards")
    manifest = {"format": ckpt.SHARDED_FORMAT, "step": step, "created_unix": time.time(), "files": files}
    (tmp / ckpt.MANIFEST_FILE).write_bytes(json.dumps(manifest, indent=2).encode())
    fsync_path(tmp / ckpt.MANIFEST_FILE)
    fsync_path(tmp / DCP_DIR)
    fsync_path(tmp)
    if final.exists():  # the same step saved again after a restart: replace it
        ckpt.discard(final)
    replace_durably(tmp, final)


def is_sharded_checkpoint(state: dict[str, Any]) -> bool:
    """Whether a checkpoint's ``state.pt`` leaves model and optimizer to the DCP shards."""
    return state.get("sharded") == DCP_DIR


def load_sharded(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> None:
    """Collective. Load a sharded checkpoint's model and optimizer state into ``model`` (FSDP,
    HSDP or DDP, any world size): each rank reads only the pieces it holds. The caller has
    verified the checkpoint's manifest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    sd = _state_dicts(model, optimizer)
    dcp.load(sd, storage_reader=dcp.FileSystemReader(Path(path) / DCP_DIR), process_group=info.io_group)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
