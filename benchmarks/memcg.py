"""A limit on a benchmark process's real memory, as a container's memory limit sets it: a child
of this process's own memory cgroup (cgroup v1's ``memory`` controller, or cgroup v2's
``memory.max``) that the measured process joins once its imports are done.

Why not only ``RLIMIT_DATA``: that limit counts address space, and a process reserves far more
than it touches. Under it, Arrow's CSV reader failed with 16-25 MB of anonymous memory in use,
because five new threads had each mapped an 8 MB stack (measured from ``/proc/self/maps``,
2026-12-01). A Kubernetes memory limit is a cgroup limit on pages actually charged; that is
what a pipeline's pod meets, so it is what the row judges. Joining after the imports leaves
their pages charged where they were (a v1 cgroup moves no charges on ``cgroup.procs`` unless
``move_charge_at_immigrate`` is set, v2 never does), so the limit is on what the work adds.

The harness creates the cgroup and removes it after the process ended (a cgroup whose process
was killed by its limit cannot remove itself); the process joins with ``join``."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def own_cgroup(proc_cgroup: str, root: Path = ROOT) -> tuple[str, Path] | None:
    """(version, directory) of the memory cgroup named by ``/proc/self/cgroup``'s text: the v1
    ``memory`` hierarchy's line where one is mounted, otherwise the v2 line (``0::``) where the
    unified hierarchy offers the memory controller. None where neither is there."""
    v2 = None
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(",") and (root / "memory").is_dir():
            return "v1", root / "memory" / path.lstrip("/")
        if hid == "0" and controllers == "":
            v2 = path.lstrip("/")
    if v2 is not None:
        for mount in (root, root / "unified"):
            if "memory" in _read(mount / "cgroup.controllers").split():
                return "v2", mount / v2
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextmanager
def limited_cgroup(limit_bytes: int, name: str):
    """A new memory cgroup capped at ``limit_bytes`` (swap included), as a child of this
    process's own; yields ``(version, directory)`` or None where no writable memory cgroup is
    here (the caller then says it measured without one). Removed on leaving."""
    found = own_cgroup(_read(Path("/proc/self/cgroup")))
    if found is None:
        yield None
        return
    version, parent = found
    path = parent / f"{name}-{os.getpid()}"
    try:
        path.mkdir()
    except OSError:
        yield None
        return
    try:
        if version == "v1":
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            if (path / "memory.memsw.limit_in_bytes").exists():  # no swapping past the limit either
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (path / "memory.max").write_text(str(limit_bytes))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        yield version, path
    finally:
        _remove(path)


def _remove(path: Path) -> None:
    # the process that joined may take a moment to leave once it exited (its charges move to
    # the parent); rmdir fails with EBUSY until then
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    path.rmdir()  # raises with the reason


def join(path: str | os.PathLike) -> None:
    """Move this process (all its threads) into the cgroup at ``path``."""
    (Path(path) / "cgroup.procs").write_text(str(os.getpid()))


def peak_bytes(version: str, path: str | os.PathLike) -> int | None:
    """The most memory the cgroup held (page cache included: the kernel reclaims it at the
    limit, so a peak at the limit means reclaim ran, not that the process ran short)."""
    name = "memory.max_usage_in_bytes" if version == "v1" else "memory.peak"
    text = _read(Path(path) / name).strip()
    return int(text) if text else None
