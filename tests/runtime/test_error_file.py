"""The error file torchelastic's agent reads is whole or absent, even when SIGTERM lands mid-write."""

import json
import os
import signal

import pytest

from training_runtime.observe.error_file import AtomicErrorHandler


class Terminated(Exception):
    pass


@pytest.fixture
def sigterm_raises():
    def handler(signum, frame):
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, handler)
    yield
    signal.signal(signal.SIGTERM, old)


def _record(handler: AtomicErrorHandler) -> None:
    try:
        raise ValueError("gloo: connection closed by peer")
    except ValueError as e:
        handler.record_exception(e)


def test_sigterm_during_the_write_leaves_no_file_rather_than_half_of_one(tmp_path, monkeypatch,
                                                                         sigterm_raises):
    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))

    def dump_interrupted(obj, fp, **kw):
        fp.write("{")  # the agent's SIGTERM arrives between the first and the last byte
        fp.flush()
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(json, "dump", dump_interrupted)
    with pytest.raises(Terminated):
        _record(AtomicErrorHandler())
    assert list(tmp_path.iterdir()) == []  # neither a torn record nor a temporary


def test_a_whole_record_is_what_torchelastic_reads(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))
    _record(AtomicErrorHandler())
    failure = ProcessFailure(local_rank=1, pid=1234, exitcode=1, error_file=str(target))
    assert failure.message["message"] == "ValueError: gloo: connection closed by peer"
    assert list(tmp_path.iterdir()) == [target]


def test_a_failed_write_leaves_no_file_for_the_agent_to_misread(tmp_path, monkeypatch):
    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))

    def dump_fails(obj, fp, **kw):
        fp.write('{"message": ')
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", dump_fails)
    with pytest.raises(OSError, match="disk full"):
        _record(AtomicErrorHandler())
    assert list(tmp_path.iterdir()) == []


def test_without_an_error_file_the_record_is_only_logged(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    _record(AtomicErrorHandler())
    assert list(tmp_path.iterdir()) == []
