"""Crash-safe file writes and inter-process locks for stores that live in a directory.

Several processes (Dagster step workers, torchrun ranks) share one store root, so every
update is either a rename of a fully written, fsynced file or happens under an fcntl lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

CHUNK_BYTES = 1024 * 1024


def fsync_dir(directory: Path) -> None:
    """Persist a rename: the directory entry itself must reach the disk, not only the file."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def copy_stream_hashing(src: BinaryIO, dest_dir: Path) -> tuple[Path, str, int]:
    """Copy ``src`` into a new temporary file in ``dest_dir`` in chunks.

    Returns (temporary path, sha256 hex, size); the file is fsynced and the caller renames it.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".incoming.", suffix=".tmp")
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp), digest.hexdigest(), size


def atomic_copy_file(src: Path, dest: Path) -> Path:
    """Copy ``src`` to ``dest`` (streamed) so ``dest`` never exists half-written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, CHUNK_BYTES)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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

