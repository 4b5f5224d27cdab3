"""Crash-safe file writes, written once for the whole project.

A file that is rewritten in place can be read, or survive a crash, half-written. So every
write here goes to a new temporary file in the destination's directory, which is flushed and
fsynced, then renamed over the destination: a rename within one filesystem is atomic, so a
reader sees the old file or the whole new one, never a mix. The rename itself is an update of
the directory, and it reaches the disk only when the directory is fsynced too; until then a
power loss can bring the old name back, or no name at all.

Standard library only: the training pods import this without torch or Dagster, and the
stores and pipelines import it from here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file (its content reaches the disk) or a directory (the names in it do: a rename,
    a new file or a deletion)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename ``tmp`` (a file or directory the caller has already written and fsynced) over
    ``final`` and fsync their directory, so that the rename survives a power loss.
    ``tmp`` must sit on the same filesystem as ``final``, or the rename is not atomic."""
    os.replace(tmp, final)
    fsync_path(Path(final).parent)


def _open_temporary(directory: Path, name: str, mode: str) -> IO:
    """Create and open a new file named after ``name`` in ``directory``.

    Dot-prefixed so listings skip it. The random part keeps concurrent writers (processes and
    threads) of one destination apart, and O_EXCL makes a clash fail instead of two writers
    sharing a file. Mode 0o666 less the umask, as a plain ``open`` creates files (mkstemp's
    0o600 would hide the result from the other users that read it)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.{uuid.uuid4().hex[:12]}.tmp"
    return open(tmp, mode, opener=_create_exclusively)


def _create_exclusively(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)


@contextmanager
def _removed_on_error(tmp: Path) -> Iterator[None]:
    """Delete ``tmp`` when the block raises (a failed write, a signal, a refused rename), so a
    failure leaves no temporary behind; the exception goes on to the caller."""
    try:
        yield
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def durable_temporary(directory: str | os.PathLike, name: str, mode: str = "wb") -> Iterator[IO]:
    """Yield a new temporary file in ``directory``, for a caller that picks its final name only
    once the content is written (e.g. content-addressed by a hash of it). When the block ends
    the file is flushed, fsynced and closed, and the caller publishes ``Path(f.name)`` with
    ``replace_durably`` (or deletes it); when the block raises, the file is deleted."""
    f = _open_temporary(Path(directory), name, mode)
    with _removed_on_error(Path(f.name)):
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())


@contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb", *,
                  staging_dir: str | os.PathLike | None = None) -> Iterator[IO]:
    """Yield a file object to stream the new content of ``path`` into; when the block ends it
    is fsynced and renamed over ``path`` durably, and when the block raises it is deleted and
    ``path`` keeps its old content.

    The temporary lives beside ``path`` unless ``staging_dir`` names another directory on the
    same filesystem; the block may then still refuse the write (raise) after streaming it,
    before anything is created next to ``path``, and must itself create ``path``'s directory."""
    path = Path(path)
    directory = Path(staging_dir) if staging_dir is not None else path.parent
    with durable_temporary(directory, path.name, mode) as f:
        yield f
    tmp = Path(f.name)
    with _removed_on_error(tmp):
        replace_durably(tmp, path)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield the name of an empty temporary file beside ``path``, for writers that open the file
    themselves by name (a library, a downloader); on success it is fsynced and renamed over
    ``path`` durably, and when the block raises it is deleted."""
    path = Path(path)
    with _open_temporary(path.parent, path.name, "wb") as empty:
        tmp = Path(empty.name)
    with _removed_on_error(tmp):
        yield tmp
        fsync_path(tmp)
        replace_durably(tmp, path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    with atomic_output(path) as f:
        f.write(data)
