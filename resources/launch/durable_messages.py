"""A training's Pipes messages in a file beside its checkpoints, so a retry reads what a dead reader had not.

``PipesTempFileMessageReader`` keeps the message file in a temporary folder of the run worker.
When that worker is SIGKILLed, its reader thread dies with it: the lines it had not read yet,
and those the training wrote before the supervisor (resources/launch/supervise.py) ended it,
are never read, and the retry cannot find the file. Seen in a wine sweep: 14 of 156 validation
lines never reached either run's event log.

Here each launch's messages go to ``<work dir>/pipes/<launch>.jsonl`` (the work dir is the
checkpoint directory's parent: a training's own folder, a sweep trial's folder) and the reader
records, in ``<launch>.jsonl.read``, the byte offset after the last message it handed on. A
session that closes normally removes both files. A retry calls ``catch_up`` before it launches
(or, for a sweep trial that had finished, instead of launching): every file left behind is read
from its recorded offset once the training that wrote it has ended (the supervisor's lock), and
its log lines and custom messages are reported in the retry's step. The offset is written after
the message is handed on, so a kill between the two repeats one message, never loses one.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from threading import Event
from typing import Any

import dagster as dg

from resources.launch.live_telemetry import ForwardsTrainingMessages, LiveTrainingMessages
from resources.launch.pipes_reader import CompleteLineFileMessageReader, complete_lines, not_a_message, parse_message

MESSAGES_DIR = "pipes"
SUFFIX = ".jsonl"
READ_SUFFIX = ".read"  # the offset file beside a message file
LOCK_FILE = ".training.lock"  # held by resources/launch/supervise.py while the training runs
OFFSET_WIDTH = 20  # the offset as fixed-width text, rewritten in place
LOCK_WAIT_S = 120.0  # the supervisor ends a dead worker's training within its 10 s grace


def messages_file(work_dir: Path, launch: str) -> Path:
    """Where launch ``launch`` (``launch_<k>``, as its log folder is named) of the training in
    ``work_dir`` writes its messages."""
    return Path(work_dir) / MESSAGES_DIR / f"{launch}{SUFFIX}"


def read_offset(path: Path) -> int:
    """The byte offset up to which ``path``'s messages were handed on (0 when none were)."""
    try:
        text = Path(f"{path}{READ_SUFFIX}").read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


class _Offset:
    """The offset file, held open and rewritten in place (one small write per message)."""

    def __init__(self, path: Path, start: int = 0):
        self.fd = os.open(f"{path}{READ_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o644)
        self.set(start)

    def set(self, offset: int) -> None:
        os.pwrite(self.fd, str(offset).rjust(OFFSET_WIDTH).encode(), 0)

    def close(self) -> None:
        os.close(self.fd)


def _lines_from(path: Path, offset: int, should_stop) -> Iterator[Any]:
    for line in complete_lines(path, should_stop):
        if line.offset >= offset:
            yield line


class DurableFileMessageReader(CompleteLineFileMessageReader):
    """Reads ``path`` by whole lines (pipes_reader.py) and records how far it got (see the module's text)."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        super().__init__(str(path), cleanup_file=True, **kwargs)

    @contextmanager
    def read_messages(self, handler: Any) -> Iterator[dg.PipesParams]:
        with super().read_messages(handler) as params:
            yield params
        # Closed normally: every message was read, the file is gone, so is its offset.
        Path(f"{self._path}{READ_SUFFIX}").unlink(missing_ok=True)

    def _reader_thread(self, handler: Any, is_resource_complete: Event) -> None:
        offset = _Offset(Path(self._path))
        try:
            for line in complete_lines(self._path, is_resource_complete.is_set):
                _hand_on(handler.handle_message, self._path, line,
                         lambda text: handler._context.log.warning(text))  # noqa: SLF001 (as Dagster's readers log)
                offset.set(line.offset + len(line.data) + 1)
        except Exception:
            handler.report_pipes_framework_exception(f"{self.__class__.__name__} reader thread", sys.exc_info())
            raise
        finally:
            offset.close()


class LiveDurableFileMessageReader(ForwardsTrainingMessages, DurableFileMessageReader):
    """The local launcher's reader: a file beside the checkpoints, by whole lines, forwarding live."""


def _hand_on(handle, path, line, warn) -> None:
    try:
        if not line.complete:
            raise ValueError("no newline")
        message = parse_message(line)
    except ValueError as exc:
        warn(not_a_message(path, line, exc))
        return
    if message is not None:
        handle(message)


def leftover_files(work_dir: Path) -> list[Path]:
    """Message files of ``work_dir``'s launches whose session never closed, oldest launch first."""
    folder = Path(work_dir) / MESSAGES_DIR
    if not folder.is_dir():
        return []
    files = [p for p in folder.glob(f"*{SUFFIX}") if p.is_file()]
    return sorted(files, key=lambda p: (len(p.stem), p.stem))


@contextmanager
def _training_ended(work_dir: Path, log) -> Iterator[None]:
    """Wait until no supervisor holds the training's lock: the training that wrote the files has ended."""
    lock = Path(work_dir) / LOCK_FILE
    if not lock.exists():
        yield
        return
    fd = os.open(lock, os.O_RDWR)
    deadline = time.monotonic() + LOCK_WAIT_S
    held = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning(f"[pipes] the training in {work_dir} still holds {lock} after {LOCK_WAIT_S:.0f} s; "
                                "reading the messages it left so far")
                    break
                time.sleep(0.2)
        yield
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def catch_up(context: dg.OpExecutionContext | dg.AssetExecutionContext, work_dir: Path) -> int:
    """Report, in ``context``'s step, the messages of ``work_dir``'s earlier launches that their
    reader never handed on (its run worker died); return how many. Log lines go to the step's log
    as Dagster's Pipes handler logs them, custom messages to the live telemetry (observations,
    detections); a dead session's other messages (opened, closed) mean nothing to a new one."""
    files = leftover_files(work_dir)
    if not files:
        return 0
    live = LiveTrainingMessages(context)
    total = 0
    with _training_ended(work_dir, context.log):
        for path in files:
            start = read_offset(path)
            count = 0

            def handle(message: dict) -> None:
                nonlocal count
                method, params = message.get("method"), message.get("params") or {}
                if method == "log":
                    context.log.log(str(params.get("level", "info")).lower(), params.get("message", ""))
                    count += 1
                elif method == "report_custom_message":
                    live(params.get("payload"))
                    count += 1

            offset = _Offset(path, start)
            try:
                for line in _lines_from(path, start, lambda: True):
                    _hand_on(handle, path, line, context.log.warning)
                    offset.set(line.offset + len(line.data) + 1)
            finally:
                offset.close()
            live.flush()
            if count:
                context.log.info(f"[pipes] {count} message(s) of {path} (from byte {start}) that the run worker "
                                 "which launched that training had not read before it died are reported above")
            path.unlink()
            Path(f"{path}{READ_SUFFIX}").unlink(missing_ok=True)
            total += count
    return total

