"""Crash-safe file writes and inter-process locks for stores that live in a directory.

Several processes (Dagster step workers, torchrun ranks) share one store root, so every
update is either a rename of a fully written, fsynced file or happens under an fcntl lock.
The writes are ``training_runtime.atomic_files``'; what is here is what only stores need: a
copy that hashes as it streams, and the locks.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from training_runtime.atomic_files import atomic_output, durable_temporary

CHUNK_BYTES = 1024 * 1024


def copy_stream_hashing(src: BinaryIO, dest_dir: Path) -> tuple[Path, str, int]:
    """Copy ``src`` into a new temporary file in ``dest_dir`` in chunks, hashing as it goes.

    Returns (temporary path, sha256 hex, size); the file is fsynced and the caller, which names
    it by the hash only now known, publishes it with ``replace_durably`` or deletes it.
    """
    digest = hashlib.sha256()
    size = 0
    with durable_temporary(dest_dir, "incoming") as out:
        while chunk := src.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return Path(out.name), digest.hexdigest(), size


def atomic_copy_file(src: Path, dest: Path) -> Path:
    """Copy ``src`` to ``dest`` (streamed) so ``dest`` never exists half-written."""
    with atomic_output(dest) as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out, CHUNK_BYTES)
    return dest


@contextmanager
def file_lock(lock_path: Path, shared: bool = False) -> Iterator[None]:
    """Hold an fcntl lock on ``lock_path``; shared for readers, exclusive for writers.

    flock locks belong to the open file description, so opening the file anew on each call
    also serialises threads of one process, not only separate processes.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        # Closing the descriptor releases the lock, also when the body raised.
        os.close(fd)

