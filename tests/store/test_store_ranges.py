"""Ranged reads (``read_range``, ``stat_object``, ``open_object``) on every store backend.

A sharding step reads only its row groups of a raw copy through these, so a store that answered
a range with the whole object, or clipped it differently from another backend, would make a step
read the wrong rows or all of them. The semantics are a file's ``pread``: clipped at the end,
empty at or past it.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.store.base import MAIN, RefNotFoundError, StoreError, VersionedStore

DATA = bytes(range(256)) * 40 + b"end"  # 10243 bytes, every offset's byte known


@pytest.fixture
def commit(store: VersionedStore) -> str:
    store.put_object(MAIN, "data.bin", DATA)
    store.put_object(MAIN, "empty.bin", b"")
    return store.commit(MAIN, "ranges").id


@pytest.mark.parametrize("start,length", [(0, 10), (0, len(DATA)), (5000, 1234), (len(DATA) - 3, 3), (1, 1)])
def test_a_range_inside_the_object_is_exactly_its_bytes(store: VersionedStore, commit: str, start: int, length: int):
    assert store.read_range(commit, "data.bin", start, length) == DATA[start:start + length]


def test_a_range_past_the_end_is_clipped_and_one_starting_there_is_empty(store: VersionedStore, commit: str):
    assert store.read_range(commit, "data.bin", len(DATA) - 3, 100) == b"end"
    assert store.read_range(commit, "data.bin", len(DATA), 10) == b""
    assert store.read_range(commit, "data.bin", len(DATA) + 1000, 10) == b""


def test_an_empty_object_and_a_zero_length_range_read_nothing(store: VersionedStore, commit: str):
    assert store.read_range(commit, "empty.bin", 0, 10) == b""
    assert store.read_range(commit, "data.bin", 100, 0) == b""
    assert store.stat_object(commit, "empty.bin").size_bytes == 0
    assert store.stat_object(commit, "data.bin").size_bytes == len(DATA)


def test_a_missing_object_fails_even_for_zero_bytes(store: VersionedStore, commit: str):
    for length in (0, 10):
        with pytest.raises(RefNotFoundError):
            store.read_range(commit, "missing.bin", 0, length)
    with pytest.raises(RefNotFoundError):
        store.open_object(commit, "missing.bin")


def test_a_negative_range_is_refused_naming_it(store: VersionedStore, commit: str):
    for start, length in ((-1, 10), (0, -1)):
        with pytest.raises(StoreError, match="0 or more"):
            store.read_range(commit, "data.bin", start, length)


def test_a_branch_reads_its_uncommitted_object(store: VersionedStore, commit: str):
    store.create_branch("edit", MAIN)
    store.put_object("edit", "data.bin", b"0123456789")
    assert store.read_range("edit", "data.bin", 3, 4) == b"3456"
    assert store.read_range(commit, "data.bin", 3, 4) == DATA[3:7]


def test_the_opened_object_is_a_seekable_file(store: VersionedStore, commit: str):
    f = store.open_object(commit, "data.bin")
    assert f.seekable() and f.readable() and f.size() == len(DATA)
    assert f.read(4) == DATA[:4] and f.tell() == 4
    f.seek(-3, io.SEEK_END)
    assert f.read() == b"end" and f.read(10) == b""
    f.seek(2000)
    buffer = bytearray(16)
    assert f.readinto(buffer) == 16 and bytes(buffer) == DATA[2000:2016]
    with pytest.raises(ValueError, match="before the start"):
        f.seek(-1)


def test_reads_inside_a_range_already_fetched_cost_no_request(store: VersionedStore, commit: str):
    f = store.open_object(commit, "data.bin")
    f.seek(1000)
    f.read(4000)
    f.seek(2000)
    assert f.read(100) == DATA[2000:2100]
    assert (f.requests, f.bytes_fetched) == (1, 4000)


def test_pyarrow_reads_one_row_group_fetching_about_its_bytes(store: VersionedStore, tmp_path):
    table = pa.table({"id": np.arange(40_000), "x": np.random.default_rng(0).random(40_000)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=5_000)
    store.put_file(MAIN, "t.parquet", tmp_path / "t.parquet")
    commit = store.commit(MAIN, "table").id
    f = store.open_object(commit, "t.parquet")
    source = pq.ParquetFile(f, pre_buffer=True)
    assert source.read_row_group(2).equals(table.slice(10_000, 5_000))
    size = os.path.getsize(tmp_path / "t.parquet")
    group = source.metadata.row_group(2)
    group_bytes = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    footer = min(size, 64 << 10)  # pyarrow's first footer read
    assert f.bytes_fetched <= group_bytes + footer < size / 2


def test_lakefs_retries_a_failed_range_and_serves_only_the_range(lakefs_store, lakefs_server):
    lakefs_store.put_object(MAIN, "data.bin", DATA)
    commit = lakefs_store.commit(MAIN, "ranges").id
    before = lakefs_server.served("data.bin")
    lakefs_server.inject("503", 2)  # fewer than the store's 3 attempts
    assert lakefs_store.read_range(commit, "data.bin", 100, 50) == DATA[100:150]
    assert lakefs_server.proxy.faults_served == ["503", "503"]
    assert lakefs_server.served("data.bin") - before == 50


def test_an_object_that_changes_under_an_open_file_fails_naming_the_fix(store: VersionedStore, commit: str):
    store.create_branch("moving", MAIN)
    f = store.open_object("moving", "data.bin")
    store.put_object("moving", "data.bin", b"short")
    f.seek(100)
    with pytest.raises(StoreError, match="changed while read: read it at a commit id"):
        f.read(50)


def test_a_closed_object_is_not_read(store: VersionedStore, commit: str):
    with store.open_object(commit, "data.bin") as f:
        assert f.read(3) == DATA[:3]
    with pytest.raises(ValueError, match="after it was closed"):
        f.read(3)
