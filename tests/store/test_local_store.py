"""What only the embedded store promises: on-disk layout, content addressing, locking."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from resources.store.base import MAIN, RefNotFoundError, StoreError
from resources.store.factory import make_store
from resources.store.local import LocalVersionedStore

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_same_content_is_stored_once_and_read_only(local_store: LocalVersionedStore):
    local_store.put_object(MAIN, "a/one.bin", b"same bytes")
    local_store.put_object(MAIN, "b/two.bin", b"same bytes")
    local_store.commit(MAIN, "two paths, one content")
    objects = [p for p in (local_store.repo_dir / "objects").rglob("*") if p.is_file()]
    assert len(objects) == 1
    assert objects[0].read_bytes() == b"same bytes"
    assert objects[0].name == hashlib.sha256(b"same bytes").hexdigest()[2:]
    assert not stat.S_IMODE(objects[0].stat().st_mode) & 0o222
    # No temporary files survive a write.
    assert not [p for p in local_store.repo_dir.rglob("*.tmp")]


def test_commit_id_is_the_hash_of_its_record(local_store: LocalVersionedStore):
    local_store.put_object(MAIN, "x", b"1")
    commit = local_store.commit(MAIN, "msg", {"k": "v"})
    record_bytes = (local_store.repo_dir / "commits" / f"{commit.id}.json").read_bytes()
    assert hashlib.sha256(record_bytes).hexdigest() == commit.id
    record = json.loads(record_bytes)
    assert record["message"] == "msg" and record["metadata"] == {"k": "v"}
    assert record["parents"] == list(commit.parents)


def test_merge_fast_forwards_when_nothing_is_recorded(local_store: LocalVersionedStore):
    local_store.create_branch("run-1")
    local_store.put_object("run-1", "x", b"1")
    source = local_store.commit("run-1", "x").id
    assert local_store.merge("run-1", MAIN) == source == local_store.resolve_ref(MAIN)


def test_merge_with_message_or_metadata_records_a_merge_commit(local_store: LocalVersionedStore):
    # Lineage metadata on the publish must not be lost to a fast-forward.
    base = local_store.resolve_ref(MAIN)
    local_store.create_branch("run-1")
    local_store.put_object("run-1", "x", b"1")
    source = local_store.commit("run-1", "x").id
    head = local_store.merge("run-1", MAIN, metadata={"dagster_run_id": "r"})
    commit = local_store.get_commit(head)
    assert commit.parents == (base, source)
    assert commit.metadata == {"dagster_run_id": "r"}


def test_merging_an_already_merged_source_changes_nothing(local_store: LocalVersionedStore):
    local_store.create_branch("run-1")
    local_store.put_object("run-1", "x", b"1")
    local_store.commit("run-1", "x")
    head = local_store.merge("run-1", MAIN)
    assert local_store.merge("run-1", MAIN) == head


def test_pinned_location_refuses_a_moving_branch(local_store: LocalVersionedStore):
    local_store.put_object(MAIN, "x", b"1")
    commit = local_store.commit(MAIN, "x")
    with pytest.raises(StoreError, match="commit id or tag"):
        local_store.pinned_location(MAIN, "x")
    local_store.create_tag("v1", commit.id)
    assert local_store.pinned_location("v1", "x") == local_store.pinned_location(commit.id, "x")
    assert local_store.pinned_location(commit.id, "x").extra["commit_id"] == commit.id


def test_the_store_pickles_for_worker_processes(local_store: LocalVersionedStore):
    import pickle

    local_store.put_object(MAIN, "x", b"1")
    local_store.commit(MAIN, "x")
    clone = pickle.loads(pickle.dumps(local_store))
    assert clone.get_object(MAIN, "x") == b"1"
    assert repr(clone) == repr(local_store)


def test_main_cannot_be_deleted(local_store: LocalVersionedStore):
    with pytest.raises(StoreError, match="default branch"):
        local_store.delete_branch(MAIN)


def test_a_missing_repository_says_how_to_create_it(tmp_path: Path):
    store = LocalVersionedStore(tmp_path, "not-created")
    with pytest.raises(RefNotFoundError, match="ensure_repository"):
        store.list_branches()
    with pytest.raises(RefNotFoundError, match="ensure_repository"):
        store.put_object(MAIN, "x", b"1")


@pytest.mark.parametrize("name", ["ab", "Upper", "under_score", "-dash", "x" * 64])
def test_invalid_repository_names_are_refused(tmp_path: Path, name: str):
    with pytest.raises(StoreError, match="invalid repository name"):
        LocalVersionedStore(tmp_path, name)


def test_uncommitted_diff_shows_the_staging_area(local_store: LocalVersionedStore):
    local_store.put_object(MAIN, "a", b"1")
    local_store.commit(MAIN, "a")
    local_store.put_object(MAIN, "b", b"2")
    local_store.delete_object(MAIN, "a")
    assert [(d.path, d.type) for d in local_store.uncommitted_diff(MAIN)] == [("a", "removed"), ("b", "added")]


def test_deleting_a_never_committed_object_leaves_no_change(local_store: LocalVersionedStore):
    local_store.put_object(MAIN, "tmp", b"1")
    local_store.delete_object(MAIN, "tmp")
    assert not local_store.has_uncommitted_changes(MAIN)


def test_factory_builds_the_local_store_and_refuses_bad_settings(tmp_path: Path):
    store = make_store("local", root=tmp_path, repository="repo-a")
    assert isinstance(store, LocalVersionedStore)
    with pytest.raises(StoreError, match="repository"):
        make_store("local", root=tmp_path)
    with pytest.raises(StoreError, match="unknown settings"):
        make_store("local", root=tmp_path, repository="repo-a", endpoint="x")
    with pytest.raises(StoreError, match="unknown store kind"):
        make_store("sqlite", root=tmp_path)


# --- several processes on one root ------------------------------------------------------------

def test_concurrent_writers_on_one_branch_lose_no_staged_object(local_store, tmp_path: Path):
    code = (
        "import sys; from pathlib import Path; from resources.store.local import LocalVersionedStore as S\n"
        "s = S(Path(sys.argv[1]), sys.argv[2])\n"
        "for i in range(25): s.put_object('main', f'w{sys.argv[3]}/{i}', b'x')\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(local_store.root), local_store.repository, str(w)],
                         cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        for w in range(3)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert len(local_store.list_objects(MAIN)) == 75
