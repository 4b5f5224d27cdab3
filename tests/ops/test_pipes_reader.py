"""No Pipes message is lost: the platform's message readers take a line only once its newline has
arrived (Dagster's temp-file reader parses a line still being written, and its thread dies on it),
report a complete line that is not a message with its position, and read on."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import urllib3
from dagster_pipes import _make_message

from resources.k8s.launcher import LivePodLogsMessageReader
from resources.launch.live_telemetry import LiveTempFileMessageReader
from resources.launch.pipes_reader import CompleteLineFileMessageReader, complete_lines

REPO = Path(__file__).resolve().parents[2]
WRITERS, MESSAGES = 3, 25


def _line(payload: dict) -> bytes:
    return (json.dumps(_make_message("report_custom_message", {"payload": payload})) + "\n").encode()


def _in_asset(body) -> list:
    """The custom messages of the Pipes session ``body(context)`` ran, in a real asset's step (a
    session needs one); no framework exception may show in the run's events."""
    got: list = []

    @dg.asset
    def reporting(context):
        session = body(context)
        got.extend(session.get_custom_messages())
        yield from session.get_results()  # the asset's (empty) materialization, as a Pipes asset returns it

    with dg.instance_for_test() as instance:
        result = dg.materialize([reporting], instance=instance)
        assert result.success
        # The reader thread's events reach the instance's event log, not the result's own list.
        assert not framework_exceptions(instance, result.run_id)
        got.append([e.message for e in instance.all_logs(result.run_id) if "[pipes]" in (e.message or "")
                    and "skipped and reading goes on" in e.message])
    return got


def framework_exceptions(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The "[pipes] framework exception" events of a run: a reader thread that died on a message."""
    return [e.message for e in instance.all_logs(run_id) if "[pipes] framework exception" in (e.message or "")]


def _written_in_pieces(context) -> list:
    reader = LiveTempFileMessageReader(context=context)  # what the local launcher hands PipesSubprocessClient
    with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                               message_reader=reader) as session:
        path = session.message_reader_params["path"]
        with open(path, "ab") as f:  # a stray line (a print into the file): reported, then reading goes on
            f.write(b"debug: not a message\n")
        writers = [subprocess.Popen([sys.executable, "-m", "tests.ops.pipes_writers", path, str(w), str(MESSAGES),
                                     str(100 + w)], cwd=REPO, stderr=subprocess.PIPE, text=True)
                   for w in range(WRITERS)]
        for w in writers:
            assert w.wait(timeout=120) == 0, w.stderr.read()
    return session


def test_long_messages_written_in_pieces_by_several_writers_all_arrive():
    *received, skipped = _in_asset(_written_in_pieces)
    assert len(skipped) == 1 and "line 1 (byte 0, 20 bytes) is not a Pipes message" in skipped[0]
    assert len(received) == WRITERS * MESSAGES
    assert {(m["writer"], m["index"]) for m in received} == {(w, i) for w in range(WRITERS) for i in range(MESSAGES)}
    assert all(hashlib.sha256(m["blob"].encode()).hexdigest() == m["sha256"] for m in received)
    # Each writer's messages arrive in the order it wrote them.
    for w in range(WRITERS):
        assert [m["index"] for m in received if m["writer"] == w] == list(range(MESSAGES))


class _Log:
    def __init__(self):
        self.warnings: list[str] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)


class _Handler:
    """What a reader thread asks of Dagster's PipesMessageHandler."""

    def __init__(self):
        self.messages: list[dict] = []
        self._context = type("Context", (), {"log": _Log()})()
        self.framework_exceptions: list = []

    def handle_message(self, message: dict) -> None:
        self.messages.append(message)

    def report_pipes_framework_exception(self, origin, exc_info) -> None:
        self.framework_exceptions.append((origin, exc_info))


def test_a_line_that_is_not_a_message_is_reported_with_its_position_and_reading_goes_on(tmp_path):
    path = tmp_path / "messages"
    first, second, third = (_line({"n": n}) for n in (1, 2, 3))
    broken = b'{"__dagster_pipes_version": "0.1", "method": "report_custom_message", "params": {"payl\n'
    path.write_bytes(first + broken + b"\n" + b'{"not": "pipes"}\n' + second[:40])
    handler, stop = _Handler(), threading.Event()
    reader = CompleteLineFileMessageReader(str(path))
    thread = threading.Thread(target=reader._reader_thread, args=(handler, stop))
    thread.start()
    with path.open("ab") as f:  # the rest of a line the reader has seen begin
        f.write(second[40:] + third + b'{"__dagster_pipes_version": "0.1", "met')  # the writer dies mid-line
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and not handler.framework_exceptions
    assert [m["params"]["payload"]["n"] for m in handler.messages] == [1, 2, 3]
    warnings = handler._context.log.warnings
    assert len(warnings) == 3, warnings
    assert f"line 2 (byte {len(first)}," in warnings[0] and "JSONDecodeError" in warnings[0]
    assert "line 4 (byte" in warnings[1] and "not a Pipes message" in warnings[1]
    assert "line 7 (byte" in warnings[2] and "ends without a newline" in warnings[2]


def test_complete_lines_hold_a_partial_line_back_until_its_newline(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"one\ntw")
    stops = iter([False, False, True, True])
    seen = []
    lines = complete_lines(path, lambda: next(stops), poll_s=0)
    seen.append(next(lines))
    with path.open("ab") as f:
        f.write(b"o\n")
    seen += list(lines)
    assert [(line.number, line.offset, line.data, line.complete) for line in seen] == \
        [(1, 0, b"one", True), (2, 4, b"two", True)]


class _PodLogs:
    """A pod log as the Kubernetes API streams it: ``timestamp message`` lines, through urllib3."""

    def __init__(self, lines: list[bytes]):
        self.body = b"".join(b"2026-12-01T10:00:%02d.%06dZ " % (i // 1000 % 60, i) + line for i, line in enumerate(lines))

    def read_namespaced_pod_log(self, *args, **kwargs):
        return urllib3.HTTPResponse(body=io.BytesIO(self.body), preload_content=False)


def test_the_pod_log_reader_gets_long_messages_whole():
    """Pod logs arrive through urllib3, whose response yields whole lines: messages longer than
    its 64 KB reads still arrive as one line each."""
    payloads = [{"n": n, "blob": "x" * (n * 70_000)} for n in range(4)]

    def from_pod(context) -> list:
        reader = LivePodLogsMessageReader(context=context)
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=reader) as session:
            reader.consume_pod_logs(context=context, core_api=_PodLogs([_line(p) for p in payloads]),
                                    pod_name="p-0", namespace="ns")
        return session

    *received, _ = _in_asset(from_pod)
    assert received == payloads
