"""Atomic checkpoints with a sha256 manifest, keep-last-K, optional background writes, and resume
from the newest valid checkpoint.

Layout: ``<dir>/step_000000050/{state.pt, manifest.json}``; a sharded checkpoint
(``sharded_checkpoint.py``) adds every rank's shards under ``dcp/`` and lists them in the same
manifest. A checkpoint is written into a hidden
temporary directory, then renamed into place, so a reader sees a whole checkpoint or none; its
files and directories are fsynced before the rename (``write_checkpoint``) or, by the training
loop's writer, in the background after it (see ``CheckpointWriter``). Only rank 0 writes; every
rank reads the chosen checkpoint, so ``checkpoint.dir`` must be on storage all ranks share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from training_runtime.atomic_files import atomic_output, atomic_write_bytes, fsync_path, replace_durably
from training_runtime.checkpoint.staging import DeferredCopy, copy_into, optimizer_storages

log = logging.getLogger(__name__)

FORMAT = "training_runtime.checkpoint/v1"
SHARDED_FORMAT = "training_runtime.checkpoint.sharded/v1"  # state.pt plus torch.distributed.checkpoint shards
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"


# ---------------------------------------------------------------- atomic files
def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> None:
    with atomic_output(path) as f:  # streamed to disk: no second copy of the bytes in memory
        torch.save(obj, f)


# ---------------------------------------------------------------- RNG state
def rng_state(device: torch.device) -> dict[str, Any]:
    """RNG states as plain tensors / lists so ``torch.load(weights_only=True)`` reads them back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# ---------------------------------------------------------------- on-disk checkpoints
def step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of completed checkpoint directories, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            out.append((int(p.name[5:]), p))
    return sorted(out, reverse=True)


class _HashingWriter:
    """Write-only raw file for ``torch.save`` whose bytes are sha256-hashed by a second thread
    that maps them back behind the writer (from the page cache, without copying), so hashing
    overlaps the serialisation instead of adding to it (sha256 of a 72 MB state takes 0.054 s,
    torch.save 0.068 s here; hashlib releases the GIL). Reading the file back rather than hashing
    the buffers ``write`` is handed keeps no reference to memory torch may reuse after the call.
    ``follow=False`` starts the hashing only at ``close``: the write then has both cores to itself
    (the training loop's writer publishes in the background, where the hash no longer stalls
    anyone)."""

    def __init__(self, path: Path, follow: bool = True):
        self.f = open(path, "wb", buffering=0)
        self.num_bytes = 0
        self._sha256 = hashlib.sha256()
        self._hashed = 0
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._fd = os.open(path, os.O_RDONLY)
        self._thread = threading.Thread(target=self._hash, args=(self._fd,), name="ckpt-hasher", daemon=True)
        self._started = follow
        if follow:
            self._thread.start()

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            done += self.f.write(view[done:])
        with self._cond:
            self.num_bytes += done
            self._cond.notify()
        return done

    def flush(self) -> None:
        pass  # unbuffered

    def _hash(self, fd: int) -> None:
        try:
            while True:
                with self._cond:
                    while self._hashed >= self.num_bytes and not self._closed:
                        self._cond.wait()
                    end, closed = self.num_bytes, self._closed
                while self._hashed < end:
                    # Straight from the page cache through a map of the new bytes: no copy.
                    start = self._hashed - self._hashed % mmap.ALLOCATIONGRANULARITY
                    length = min(end, start + (16 << 20)) - start
                    with mmap.mmap(fd, length, offset=start, access=mmap.ACCESS_READ) as m:
                        with memoryview(m) as view:
                            self._sha256.update(view[self._hashed - start:])
                    self._hashed = start + length
                if closed and self._hashed >= self.num_bytes:
                    return
        except BaseException as e:
            self._error = e
        finally:
            os.close(fd)

    def close(self) -> str:
        """Close the file; the sha256 of everything written."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if not self._started:
            self._started = True
            self._thread.start()
        self._thread.join()
        self.f.close()
        if self._error is not None:
            raise self._error
        return self._sha256.hexdigest()

    def abort(self) -> None:
        with self._cond:
            self._closed = True
            self.num_bytes = self._hashed  # nothing more to hash
            self._cond.notify()
        if self._started:
            self._thread.join()
        else:
            os.close(self._fd)
        self.f.close()


def save_hashed(path: Path, obj: Any) -> dict[str, Any]:
    """``torch.save`` of ``obj`` to ``path``, streamed to disk and hashed beside (no in-memory
    copy); returns its manifest entry ``{"sha256", "num_bytes"}``."""
    out = _HashingWriter(path)
    try:
        torch.save(obj, out)
    except BaseException:
        out.abort()
        raise
    return {"sha256": out.close(), "num_bytes": out.num_bytes}


def write_checkpoint(root: str | os.PathLike, step: int, state: dict[str, Any],
                     before_publish: Callable[[int], None] | None = None, *, durable: bool = True) -> Path:
    """Write ``state`` as checkpoint ``step`` atomically; returns its directory.
    ``before_publish(step)`` runs once the state file is on disk, before the manifest and the
    rename that publish it (the fault-injection tests kill the process there).

    ``durable=False`` publishes without waiting for the disk: nothing is fsynced and the caller
    runs ``make_durable`` on the result before it counts on the checkpoint surviving a power loss
    (``CheckpointWriter`` does so in the background, and prunes older checkpoints only after)."""
    return serialise_checkpoint(root, step, state).publish(before_publish, durable=durable)


class Serialised:
    """A checkpoint whose state file is written into its hidden directory and not yet published:
    its sha256 may still be being computed from the page cache (``_HashingWriter``). ``publish``
    finishes the hash, writes the manifest and renames the directory into place."""

    def __init__(self, root: Path, step: int, tmp: Path, out: _HashingWriter):
        self.root, self.step, self.tmp, self.out = root, step, tmp, out

    def publish(self, before_publish: Callable[[int], None] | None = None, *, durable: bool = True) -> Path:
        """``write_checkpoint``'s second half: the published directory."""
        entry = {"sha256": self.out.close(), "num_bytes": self.out.num_bytes}
        tmp, final = self.tmp, self.root / step_dir_name(self.step)
        if durable:
            fsync_path(tmp / STATE_FILE)
        if before_publish is not None:
            before_publish(self.step)
        manifest = {"format": FORMAT, "step": self.step, "created_unix": time.time(),
                    "files": {STATE_FILE: entry}}
        (tmp / MANIFEST_FILE).write_bytes(json.dumps(manifest, indent=2).encode())
        if durable:
            fsync_path(tmp / MANIFEST_FILE)
            fsync_path(tmp)
        if final.exists():  # the same step saved again after a restart: replace it
            discard(final)
        if durable:
            replace_durably(tmp, final)
        else:
            os.replace(tmp, final)  # make_durable fsyncs the root for it later
        return final


def serialise_checkpoint(root: str | os.PathLike, step: int, state: dict[str, Any], *,
                         hash_while_writing: bool = True) -> Serialised:
    """``write_checkpoint``'s first half: ``state`` streamed by ``torch.save`` into a hidden
    directory, with no copy of its tensors first. Once it returns the file holds every byte of the
    state (in the page cache), so training may change the tensors again; only the sha256 of the
    file's last bytes may still be running, on the hasher's thread (all of it, with
    ``hash_while_writing=False``: ``publish`` then hashes the file)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}-{threading.get_ident()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    out = _HashingWriter(tmp / STATE_FILE, follow=hash_while_writing)
    try:
        torch.save(state, out)
    except BaseException:
        out.abort()
        raise
    return Serialised(root, step, tmp, out)


def discard(path: Path) -> None:
    """Unpublish a checkpoint: renamed out of the listing first, so a crash mid-delete leaves
    only a ``.trash-`` directory, which ``remove_stale_temporaries`` clears."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def make_durable(path: Path) -> None:
    """fsync a checkpoint published with ``durable=False``: its files, its directory, and the
    parent that holds the rename. A failure here means the disk may not hold it."""
    for name in (STATE_FILE, MANIFEST_FILE):
        fsync_path(path / name)
    fsync_path(path)
    fsync_path(path.parent)


def verify_checkpoint(path: Path) -> None:
    """Raise ValueError with the reason when the checkpoint's files do not match its manifest."""
    mpath = path / MANIFEST_FILE
    if not mpath.is_file():
        raise ValueError(f"{MANIFEST_FILE} missing")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{MANIFEST_FILE} unreadable: {e}") from e
    if manifest.get("format") not in (FORMAT, SHARDED_FORMAT):
        raise ValueError(f"format {manifest.get('format')!r} is neither {FORMAT!r} nor {SHARDED_FORMAT!r}")
    for name, meta in manifest["files"].items():
        f = path / name
        if path.resolve() not in f.resolve().parents:  # a sharded manifest names files in dcp/
            raise ValueError(f"{name} lies outside the checkpoint directory")
        if not f.is_file():
            raise ValueError(f"{name} missing")
        if f.stat().st_size != meta["num_bytes"]:
            raise ValueError(f"{name} has {f.stat().st_size} bytes, manifest says {meta['num_bytes']}")
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while block := fh.read(8 << 20):
                h.update(block)
        if h.hexdigest() != meta["sha256"]:
            raise ValueError(f"{name} sha256 {h.hexdigest()} != manifest {meta['sha256']}")


def load_state(path: Path) -> dict[str, Any]:
    """The checkpoint's state, memory-mapped: a full checkpoint's tensors are read from the page
    cache only where used, so an FSDP rank loading its shard out of the full state does not hold
    the whole model and optimizer in its own memory (the pages are shared between the ranks of a
    node and dropped under pressure)."""
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)


def find_latest_valid(root: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """Newest checkpoint that verifies and loads; corrupt ones are skipped with a logged reason."""
    for step, path in list_checkpoints(root):
        try:
            verify_checkpoint(path)
            state = load_state(path)
        except Exception as e:  # any unreadable checkpoint is skipped, the reason is logged
            log.warning("skipping corrupt checkpoint %s: %s", path, e)
            continue
        if state.get("step") != step:
            log.warning("skipping checkpoint %s: it holds step %s", path, state.get("step"))
            continue
        return path, state
    return None


# Checkpoints a failure message calls "the last good one" (train/failures.py): kept whatever
# keep_last says, so a later attempt (a re-execution after a fix) cannot prune them away.
PINS_FILE = "pinned.json"


def pinned(root: str | os.PathLike) -> dict[str, str]:
    """Checkpoint directory name -> why it is kept."""
    path = Path(root) / PINS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def pin(root: str | os.PathLike, step: int, reason: str) -> None:
    """Keep checkpoint ``step`` from pruning, saying why (written atomically; ranks that pin the
    same checkpoint write the same entry)."""
    atomic_write_json(Path(root) / PINS_FILE, {**pinned(root), step_dir_name(step): reason})


def prune(root: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints, never a pinned one (those do not count
    toward ``keep_last``); returns the deleted paths."""
    root = Path(root)
    removed = []
    kept = pinned(root)
    for _, path in [c for c in list_checkpoints(root) if c[1].name not in kept][keep_last:]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def remove_stale_temporaries(root: str | os.PathLike) -> None:
    root = Path(root)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)


class CheckpointWriter:
    """Rank 0's writer. In sync mode training waits while ``torch.save`` streams the state into
    the checkpoint's file, no copy of it made first (``serialise_checkpoint``), and no longer:
    the end of its sha256 (computed beside the write, from the page cache), the manifest and
    rename that publish it, its fsync and the pruning of older checkpoints happen in a
    background thread, pruning only after the fsync, so a crash or power loss can cost at most
    the newest checkpoint and never leaves none. (Publishing before returning made the stall
    the sha256's, not the write's: hashing 72 MB takes 0.043 s here, ``torch.save`` of it
    0.033 s; the hash starts once the write is done, so the write has the cores to itself.) In
    async mode ``save`` instead copies the state into a host staging copy, reused
    from save to save, and the background thread also writes it. Given the ``optimizer``, the
    tensors only its step writes (parameters, moments) are copied by that thread while training
    goes on, and the optimizer's next step waits for them (``staging.DeferredCopy``); the stall
    is then the rest of the copy plus whatever of it the next forward and backward did not
    hide (``take_deferred_wait_s``). A save first waits for the previous one's background work,
    and ``wait`` for the last one's; errors surface on the next call."""

    def __init__(self, root: str, keep_last: int, async_save: bool,
                 before_publish: Callable[[int], None] | None = None):
        self.root = root
        self.before_publish = before_publish
        self.keep_last = keep_last
        self.async_save = async_save
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._staging: Any = None
        self._deferred: DeferredCopy | None = None
        self._deferred_wait_s = 0.0

    def _publish(self, step: int, state: dict[str, Any]) -> Path:
        return write_checkpoint(self.root, step, state, self.before_publish, durable=False)

    def _settle(self, path: Path) -> None:
        try:
            make_durable(path)
        except BaseException:
            discard(path)  # not known to be on disk: nothing may rely on it; the older ones stay
            raise
        prune(self.root, self.keep_last)

    def save(self, step: int, state: dict[str, Any], optimizer: torch.optim.Optimizer | None = None) -> None:
        """Checkpoint ``state`` as ``step``. ``optimizer``: the one whose step changes the state's
        parameters and optimizer state (async mode copies those beside training; see above)."""
        self.wait()
        if self.async_save:
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            owned = optimizer_storages(optimizer) if optimizer is not None else frozenset()
            staged = self._staging = copy_into(self._staging, state, owned, pairs)
            deferred = self._deferred = DeferredCopy(pairs, optimizer) if pairs else None

            def work() -> None:
                if deferred is not None:
                    deferred.run()
                self._settle(self._publish(step, staged))
        else:
            try:
                written = serialise_checkpoint(self.root, step, state, hash_while_writing=False)
            except BaseException as e:
                raise RuntimeError(f"writing a checkpoint to {self.root} failed: {e}") from e

            def work() -> None:
                self._settle(written.publish(self.before_publish, durable=False))

        def run() -> None:
            try:
                work()
            except BaseException as e:  # raised by the next save or wait, on the training thread
                self._error = e

        self._thread = threading.Thread(target=run, name=f"ckpt-writer-{step}", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Until the last save is published, on disk and older checkpoints pruned."""
        if self._deferred is not None:
            self._deferred.wait()
            self._deferred_wait_s += self._deferred.waited_s
            self._deferred = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def take_deferred_wait_s(self) -> float:
        """Seconds training has waited for deferred copies since the last call: the optimizer
        step that waited counts them as step time, the run's figures as checkpoint stall."""
        d = self._deferred
        waited = self._deferred_wait_s + (d.waited_s if d is not None else 0.0)
        self._deferred_wait_s = 0.0
        if d is not None:
            d.waited_s = 0.0
        return waited

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint to {self.root} failed: {e}") from e
