"""Being told at once when a folder gets a new entry (Linux inotify, through ctypes): a
checkpoint write takes milliseconds, too short to catch by polling from a busy process."""

from __future__ import annotations

import ctypes
import os
import select
import struct
from pathlib import Path

IN_CREATE, IN_MOVED_TO, IN_ISDIR = 0x100, 0x80, 0x40000000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


class NewEntries:
    """``with NewEntries(root) as w: folder, name = w.next(timeout_s)``: the next entry created in
    (or renamed into) ``root`` or any folder below it, folders created later included; None after
    the timeout."""

    def __init__(self, root: Path):
        self.fd = _libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.folders: dict[int, Path] = {}
        self._pending: list[tuple[Path, str]] = []
        self._watch_tree(Path(root))

    def _watch_tree(self, top: Path) -> None:
        for folder, dirs, _ in os.walk(top):
            wd = _libc.inotify_add_watch(self.fd, folder.encode(), IN_CREATE | IN_MOVED_TO)
            if wd >= 0:  # a folder removed meanwhile is simply not watched
                self.folders[wd] = Path(folder)
            dirs[:] = [d for d in dirs if not d.startswith((".tmp-", ".trash-"))]

    def next(self, timeout_s: float) -> tuple[Path, str] | None:
        if not self._pending:
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
            if not ready:
                return None
            data = os.read(self.fd, 65536)
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0").decode()
                offset += _EVENT.size + length
                if wd not in self.folders:
                    continue
                folder = self.folders[wd]
                self._pending.append((folder, name))
                if mask & IN_ISDIR and not name.startswith((".tmp-", ".trash-")):
                    self._watch_tree(folder / name)  # a new run's or trial's folder: watched too
        return self._pending.pop(0) if self._pending else None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> NewEntries:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
