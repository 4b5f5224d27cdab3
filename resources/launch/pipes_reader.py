"""A Pipes message file read by whole lines only: no message is lost to a line still being written.

Dagster 1.13's ``PipesFileMessageReader`` (behind ``PipesTempFileMessageReader``, the default of
``PipesSubprocessClient``) tails its file with ``dagster._utils.tail_file``, which yields whatever
``readline()`` returns. At the end of a file that the training process is still appending to,
that is a partial line; the reader ``json.loads`` it, the ``JSONDecodeError`` ends the reader
thread, and every later message of the run (its final figures, its "closed") is lost while the
run itself succeeds. Seen with two sweep trials writing long telemetry messages at once.

The reader here keeps the bytes after the last newline until the rest of their line arrives,
and parses only complete lines. A complete line that is still not a Pipes message (damaged
bytes, a stray print into the file) is reported in the step's log with its line number and byte
offset, and reading goes on. The messages are Dagster's own (one JSON object per line, as
``dagster_pipes`` writes them) and go to Dagster's own handler: nothing about the protocol
changes, only when a line counts as read.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from threading import Event
from typing import Any

import dagster as dg
from dagster._core.pipes.utils import PipesFileMessageReader
from dagster_pipes import PIPES_PROTOCOL_VERSION_FIELD

READ_BYTES = 1 << 16  # one read of the file at a time
POLL_S = 0.01  # how long to wait for more bytes when the file has none (as tail_file does)
SHOWN_CHARS = 200  # of a line that is not a message, in the log


@dataclass(frozen=True)
class Line:
    """One line of the file: its bytes without the newline, where it starts, and whether its
    newline arrived (False only for bytes left after the writer stopped)."""

    number: int  # 1-based
    offset: int  # byte offset of its first byte
    data: bytes
    complete: bool = True


def complete_lines(path: str | os.PathLike, should_stop: Callable[[], bool], poll_s: float = POLL_S) -> Iterator[Line]:
    """The lines of ``path`` as they become complete, while another process appends to it.

    Bytes after the last newline are held back until their newline arrives. Once ``should_stop()``
    is true the file is read to its end one last time; bytes left without a newline then are
    yielded as an incomplete line (the writer stopped in the middle of it)."""
    pending = b""
    number, offset = 0, 0
    with open(path, "rb") as f:
        while True:
            stopping = should_stop()  # asked before reading: what was written before the stop is read
            chunk = f.read(READ_BYTES)
            if chunk:
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for data in whole:
                    number += 1
                    yield Line(number, offset, data)
                    offset += len(data) + 1
                continue
            if stopping:
                break
            time.sleep(poll_s)
    if pending:
        yield Line(number + 1, offset, pending, complete=False)


def parse_message(line: Line) -> dict | None:
    """The Pipes message a line holds, or None for an empty line; ValueError saying why not."""
    text = line.data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if not text.strip():
        return None
    message = json.loads(text)
    if not isinstance(message, dict) or PIPES_PROTOCOL_VERSION_FIELD not in message:
        raise ValueError(f"a JSON {type(message).__name__} without {PIPES_PROTOCOL_VERSION_FIELD!r}, not a Pipes message")
    return message


def not_a_message(path: str | os.PathLike, line: Line, error: Exception) -> str:
    """The step-log line for a line the reader skips: where it is, why, and how it starts."""
    shown = line.data[:SHOWN_CHARS].decode("utf-8", errors="replace")
    cut = "..." if len(line.data) > SHOWN_CHARS else ""
    what = "ends without a newline (the writer stopped in the middle of it)" if not line.complete \
        else f"is not a Pipes message ({type(error).__name__}: {error})"
    return (f"[pipes] {path} line {line.number} (byte {line.offset}, {len(line.data)} bytes) {what}; it is "
            f"skipped and reading goes on. It starts: {shown!r}{cut}")


class CompleteLineFileMessageReader(PipesFileMessageReader):
    """``PipesFileMessageReader`` whose thread reads whole lines only (see the module's text)."""

    def _reader_thread(self, handler: Any, is_resource_complete: Event) -> None:
        try:
            for line in complete_lines(self._path, is_resource_complete.is_set):
                try:
                    if not line.complete:
                        raise ValueError("no newline")
                    message = parse_message(line)
                except ValueError as exc:
                    handler._context.log.warning(not_a_message(self._path, line, exc))  # noqa: SLF001 (as Dagster's readers log)
                    continue
                if message is not None:
                    handler.handle_message(message)
        except Exception:
            # What is left is the reader's own failure (the file vanished, the handler raised):
            # reported as Dagster's reader reports it, and the thread ends.
            handler.report_pipes_framework_exception(f"{self.__class__.__name__} reader thread", sys.exc_info())
            raise


class CompleteLineTempFileMessageReader(dg.PipesTempFileMessageReader):
    """``PipesTempFileMessageReader`` (a temporary file the process appends to), read by whole lines."""

    @contextmanager
    def read_messages(self, handler: Any) -> Iterator[dg.PipesParams]:
        with tempfile.TemporaryDirectory() as tempdir:
            reader = CompleteLineFileMessageReader(os.path.join(tempdir, "messages"),
                                                   include_stdio_in_messages=self._include_stdio_in_messages)
            with reader.read_messages(handler) as params:
                yield params
