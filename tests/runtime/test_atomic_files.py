"""The one crash-safe write: a file appears whole or not at all, and its rename reaches the disk."""

import os
import stat
from pathlib import Path

import pytest

from training_runtime import atomic_files
from training_runtime.atomic_files import (
    atomic_output,
    atomic_path,
    atomic_write_bytes,
    durable_temporary,
    replace_durably,
)


class Interrupted(Exception):
    pass


@pytest.fixture
def fsynced(monkeypatch):
    """The (device, inode) of everything fsynced, in order."""
    calls = []
    real = os.fsync

    def record(fd):
        st = os.fstat(fd)
        calls.append((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(atomic_files.os, "fsync", record)
    return calls


def _identity(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_an_exception_mid_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "model.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(Interrupted):
        with atomic_output(target) as out:
            out.write(b"half of the new")
            raise Interrupted()
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_a_new_file_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "sub" / "new.bin"
    with pytest.raises(Interrupted):
        with atomic_output(target) as out:
            out.write(b"x" * 10)
            raise Interrupted()
    assert list((tmp_path / "sub").iterdir()) == []
    atomic_write_bytes(target, b"whole")
    assert target.read_bytes() == b"whole"


def test_the_file_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, fsynced):
    target = tmp_path / "state.bin"
    atomic_write_bytes(target, b"data")
    assert fsynced == [_identity(target), _identity(tmp_path)]


def test_a_streamed_write_is_invisible_until_the_block_ends(tmp_path, fsynced):
    target = tmp_path / "download.bin"
    atomic_write_bytes(target, b"old")
    fsynced.clear()
    with atomic_output(target) as out:
        for i in range(5):
            out.write(bytes([i]) * 1000)
            assert target.read_bytes() == b"old"  # readers still see the whole old file
    assert target.read_bytes() == b"".join(bytes([i]) * 1000 for i in range(5))
    assert fsynced == [_identity(target), _identity(tmp_path)]
    assert list(tmp_path.iterdir()) == [target]


def test_text_mode_streams_str(tmp_path):
    with atomic_output(tmp_path / "a.csv", "w") as out:
        out.write("a,b\n1,2\n")
    assert (tmp_path / "a.csv").read_text() == "a,b\n1,2\n"


def test_a_writer_that_opens_the_file_by_name(tmp_path, fsynced):
    target = tmp_path / "error.json"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".error.json.")
        tmp.write_text("{}")
        assert not target.exists()
    assert target.read_text() == "{}"
    assert fsynced == [_identity(target), _identity(tmp_path)]
    with pytest.raises(Interrupted):
        with atomic_path(target) as tmp:
            tmp.write_text('{"half')
            raise Interrupted()
    assert target.read_text() == "{}"
    assert list(tmp_path.iterdir()) == [target]


def test_a_temporary_named_after_its_content(tmp_path, fsynced):
    with durable_temporary(tmp_path / "incoming", "blob") as out:
        out.write(b"content")
    tmp = Path(out.name)
    assert fsynced == [_identity(tmp)]  # on disk before the caller names and publishes it
    final = tmp_path / "objects" / "ab12"
    final.parent.mkdir()
    replace_durably(tmp, final)
    assert final.read_bytes() == b"content" and fsynced[-1] == _identity(final.parent)
    assert list((tmp_path / "incoming").iterdir()) == []


def test_a_write_refused_in_the_staging_directory_leaves_nothing(tmp_path):
    staging = tmp_path / ".incoming"
    target = tmp_path / "a" / "b.bin"
    with pytest.raises(Interrupted):
        with atomic_output(target, staging_dir=staging) as out:
            out.write(b"data")
            raise Interrupted()  # e.g. the key collides with another artifact
    assert list(staging.iterdir()) == [] and not target.parent.exists()
    with atomic_output(target, staging_dir=staging) as out:
        out.write(b"data")
        target.parent.mkdir()
    assert target.read_bytes() == b"data" and list(staging.iterdir()) == []


def test_new_files_get_the_mode_a_plain_open_gives(tmp_path):
    umask = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "shared.bin", b"read by other users")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "shared.bin").stat().st_mode) == 0o644
