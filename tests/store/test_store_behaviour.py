"""One behaviour suite for every VersionedStore backend, so they cannot drift apart.

Assertions stick to what lakeFS itself guarantees, so the same tests also run against a
real lakeFS (see the ``real-lakefs`` parameter in conftest.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core import housekeeping
from core.housekeeping import HousekeepingError
from resources.store.base import (
    MAIN,
    MAX_REF_BYTES,
    MergeConflictError,
    RefNotFoundError,
    StoreError,
    VersionedStore,
)
from tests.support.pinned_reads import read_location


def commit_file(store: VersionedStore, branch: str, files: dict[str, bytes], message: str = "write") -> str:
    for path, data in files.items():
        store.put_object(branch, path, data)
    return store.commit(branch, message).id


# --- repository and branches -----------------------------------------------------------------

def test_new_repository_has_main_at_its_first_commit(store: VersionedStore):
    branches = store.list_branches()
    assert list(branches) == [MAIN]
    assert store.resolve_ref(MAIN) == branches[MAIN]
    assert [c.id for c in store.log(MAIN)] == [branches[MAIN]]
    assert store.list_objects(MAIN) == []
    store.ensure_repository()  # idempotent
    assert store.list_branches() == branches


def test_branch_starts_at_source_commit_and_moves_independently(store: VersionedStore):
    first = commit_file(store, MAIN, {"a.txt": b"A"})
    assert store.create_branch("run-1", MAIN) == first
    second = commit_file(store, "run-1", {"b.txt": b"B"})
    assert store.list_branches() == {MAIN: first, "run-1": second}
    assert store.get_object("run-1", "a.txt") == b"A"
    assert not store.exists(MAIN, "b.txt")


def test_creating_an_existing_branch_fails_unless_exist_ok(store: VersionedStore):
    head = store.create_branch("run-1")
    commit_file(store, "run-1", {"x": b"1"})
    with pytest.raises(StoreError, match="already exists"):
        store.create_branch("run-1")
    assert store.create_branch("run-1", exist_ok=True) == store.resolve_ref("run-1") != head


def test_delete_branch_and_missing_branch(store: VersionedStore):
    store.create_branch("tmp")
    store.delete_branch("tmp")
    assert "tmp" not in store.list_branches()
    with pytest.raises(RefNotFoundError):
        store.resolve_ref("tmp")
    with pytest.raises(StoreError):
        store.put_object("tmp", "x", b"1")


def test_branch_from_a_missing_ref_fails(store: VersionedStore):
    with pytest.raises(RefNotFoundError):
        store.create_branch("run-1", "no-such-ref")


# --- uncommitted writes --------------------------------------------------------------------

def test_uncommitted_writes_are_visible_only_on_their_branch(store: VersionedStore):
    store.create_branch("left")
    store.create_branch("right")
    store.put_object("left", "data/x.bin", b"left-only")
    assert store.get_object("left", "data/x.bin") == b"left-only"
    assert store.has_uncommitted_changes("left")
    assert not store.has_uncommitted_changes("right")
    assert not store.has_uncommitted_changes(MAIN)
    for other in ("right", MAIN):
        assert not store.exists(other, "data/x.bin")
        with pytest.raises(RefNotFoundError):
            store.get_object(other, "data/x.bin")
    # A branch created now starts from the committed head, not from left's staging area.
    store.create_branch("later", "left")
    assert not store.exists("later", "data/x.bin")


def test_commit_makes_staged_writes_part_of_history(store: VersionedStore):
    store.create_branch("run-1")
    store.put_object("run-1", "a.txt", b"one")
    commit = store.commit("run-1", "add a")
    assert not store.has_uncommitted_changes("run-1")
    assert store.get_object(commit.id, "a.txt") == b"one"
    assert store.resolve_ref("run-1") == commit.id


def test_put_file_and_download_round_trip(store: VersionedStore, tmp_path: Path):
    src = tmp_path / "big.bin"
    payload = bytes(range(256)) * 8192  # 2 MiB: several chunks
    src.write_bytes(payload)
    store.put_file(MAIN, "blobs/big.bin", src)
    commit = store.commit(MAIN, "big file")
    dest = store.download(commit.id, "blobs/big.bin", tmp_path / "out" / "big.bin")
    assert dest.read_bytes() == payload
    [info] = store.list_objects(commit.id, "blobs/")
    assert (info.path, info.size_bytes) == ("blobs/big.bin", len(payload))
    assert info.checksum


def test_overwrite_and_delete_objects(store: VersionedStore):
    first = commit_file(store, MAIN, {"keep.txt": b"k", "gone.txt": b"g", "edit.txt": b"v1"})
    store.put_object(MAIN, "edit.txt", b"v2")
    store.delete_object(MAIN, "gone.txt")
    assert store.get_object(MAIN, "edit.txt") == b"v2"
    assert not store.exists(MAIN, "gone.txt")
    second = store.commit(MAIN, "edit and delete").id
    assert [o.path for o in store.list_objects(second)] == ["edit.txt", "keep.txt"]
    assert store.get_object(first, "gone.txt") == b"g"
    assert store.get_object(first, "edit.txt") == b"v1"


def test_delete_of_a_missing_object_fails(store: VersionedStore):
    with pytest.raises(RefNotFoundError):
        store.delete_object(MAIN, "never-written.txt")


def test_list_objects_is_sorted_and_filtered_by_prefix(store: VersionedStore):
    commit_file(store, MAIN, {"b/2": b"22", "a/1": b"1", "b/1": b"333", "bb": b"x"})
    assert [o.path for o in store.list_objects(MAIN)] == ["a/1", "b/1", "b/2", "bb"]
    listed = store.list_objects(MAIN, prefix="b/")
    assert [(o.path, o.size_bytes) for o in listed] == [("b/1", 3), ("b/2", 2)]
    assert store.exists(MAIN, "b/1")
    assert not store.exists(MAIN, "b")


def test_reading_a_missing_object_fails_with_not_found(store: VersionedStore):
    with pytest.raises(RefNotFoundError):
        store.get_object(MAIN, "missing.txt")


# --- commits and metadata -------------------------------------------------------------------

def test_commit_records_message_metadata_and_parent(store: VersionedStore):
    parent = store.resolve_ref(MAIN)
    store.put_object(MAIN, "x", b"1")
    metadata = {"dagster_run_id": "abc-123", "::lakefs::Dagster::url[url:ui]": "http://dagster/runs/abc"}
    commit = store.commit(MAIN, "ingest raw", metadata=metadata)
    fetched = store.get_commit(commit.id)
    assert fetched.id == commit.id == store.resolve_ref(MAIN)
    assert fetched.message == "ingest raw"
    assert fetched.metadata == metadata
    assert fetched.parents == (parent,)
    assert fetched.creation_date > 0
    assert store.get_commit(MAIN) == fetched


def test_non_string_metadata_is_refused_and_nothing_is_committed(store: VersionedStore):
    head = store.resolve_ref(MAIN)
    store.put_object(MAIN, "x", b"1")
    with pytest.raises(StoreError, match="'accuracy'.*float"):
        store.commit(MAIN, "bad metadata", metadata={"accuracy": 0.93, "ok": "yes"})
    assert store.resolve_ref(MAIN) == head
    assert store.has_uncommitted_changes(MAIN)


def test_commit_without_changes_is_refused_unless_allowed(store: VersionedStore):
    head = store.resolve_ref(MAIN)
    with pytest.raises(StoreError):
        store.commit(MAIN, "nothing")
    assert store.resolve_ref(MAIN) == head
    empty = store.commit(MAIN, "marker", metadata={"k": "v"}, allow_empty=True)
    assert empty.parents == (head,)


def test_commit_ids_are_immutable_reads(store: VersionedStore):
    first = commit_file(store, MAIN, {"data.csv": b"v1"})
    commit_file(store, MAIN, {"data.csv": b"v2"})
    store.put_object(MAIN, "data.csv", b"v3-uncommitted")
    assert store.get_object(first, "data.csv") == b"v1"
    assert store.get_object(MAIN, "data.csv") == b"v3-uncommitted"
    assert [o.path for o in store.list_objects(first)] == ["data.csv"]


# --- merges ------------------------------------------------------------------------------------

def test_merge_when_main_did_not_move_publishes_the_branch(store: VersionedStore):
    store.create_branch("run-1")
    source = commit_file(store, "run-1", {"shards/0.bin": b"s0"})
    head = store.merge("run-1", MAIN)
    assert head == store.resolve_ref(MAIN)
    assert store.get_object(MAIN, "shards/0.bin") == b"s0"
    # Fast-forward locally; lakeFS always records a merge commit whose parents hold the source.
    assert head == source or source in store.get_commit(head).parents
    assert source in [c.id for c in store.log(MAIN)]


def test_three_way_merge_combines_changes_to_different_paths(store: VersionedStore):
    commit_file(store, MAIN, {"shared.txt": b"base", "main-edits.txt": b"m0", "run-edits.txt": b"r0"})
    store.create_branch("run-1")
    run_head = commit_file(store, "run-1", {"run-edits.txt": b"r1", "new-from-run.txt": b"n"})
    main_head = commit_file(store, MAIN, {"main-edits.txt": b"m1"})
    merged = store.merge("run-1", MAIN, message="publish run-1", metadata={"dagster_run_id": "r1"})
    commit = store.get_commit(merged)
    assert set(commit.parents) == {main_head, run_head}
    assert commit.metadata.get("dagster_run_id") == "r1"
    assert {o.path: store.get_object(MAIN, o.path) for o in store.list_objects(MAIN)} == {
        "shared.txt": b"base", "main-edits.txt": b"m1", "run-edits.txt": b"r1", "new-from-run.txt": b"n",
    }
    # The source branch is untouched by merging it.
    assert store.resolve_ref("run-1") == run_head


def test_merge_keeps_deletions_from_either_side(store: VersionedStore):
    commit_file(store, MAIN, {"a": b"1", "b": b"2"})
    store.create_branch("run-1")
    store.delete_object("run-1", "a")
    store.commit("run-1", "drop a")
    commit_file(store, MAIN, {"c": b"3"})
    store.merge("run-1", MAIN)
    assert [o.path for o in store.list_objects(MAIN)] == ["b", "c"]


def test_conflicting_merge_raises_and_leaves_destination_untouched(store: VersionedStore):
    commit_file(store, MAIN, {"labels.csv": b"base", "other.txt": b"o"})
    store.create_branch("run-1")
    commit_file(store, "run-1", {"labels.csv": b"from run", "run-only.txt": b"r"})
    main_head = commit_file(store, MAIN, {"labels.csv": b"from main"})
    with pytest.raises(MergeConflictError) as info:
        store.merge("run-1", MAIN)
    assert info.value.paths == ["labels.csv"]
    assert "labels.csv" in str(info.value) and "unchanged" in str(info.value)
    assert store.resolve_ref(MAIN) == main_head
    assert store.get_object(MAIN, "labels.csv") == b"from main"
    assert not store.exists(MAIN, "run-only.txt")
    assert not store.has_uncommitted_changes(MAIN)


def test_merge_into_a_branch_with_uncommitted_changes_is_refused(store: VersionedStore):
    store.create_branch("run-1")
    commit_file(store, "run-1", {"x": b"1"})
    head = store.resolve_ref(MAIN)
    store.put_object(MAIN, "dirty.txt", b"d")
    with pytest.raises(StoreError):
        store.merge("run-1", MAIN)
    assert store.resolve_ref(MAIN) == head


def test_merge_ignores_the_source_branchs_uncommitted_writes(store: VersionedStore):
    store.create_branch("run-1")
    commit_file(store, "run-1", {"committed.txt": b"c"})
    store.put_object("run-1", "staged.txt", b"s")
    store.merge("run-1", MAIN)
    assert store.exists(MAIN, "committed.txt")
    assert not store.exists(MAIN, "staged.txt")


# --- tags, log, diff, refs ----------------------------------------------------------------------

def test_tags_are_immutable_pointers(store: VersionedStore):
    tagged = commit_file(store, MAIN, {"weights.pt": b"w1"})
    assert store.create_tag("digits-v1", MAIN) == tagged
    assert store.list_tags() == {"digits-v1": tagged}
    with pytest.raises(StoreError, match="digits-v1"):
        store.create_tag("digits-v1", MAIN)
    commit_file(store, MAIN, {"weights.pt": b"w2"})
    assert store.resolve_ref("digits-v1") == tagged
    assert store.get_object("digits-v1", "weights.pt") == b"w1"
    store.delete_tag("digits-v1")
    assert store.list_tags() == {}
    with pytest.raises(RefNotFoundError):
        store.resolve_ref("digits-v1")


def test_a_branch_and_a_tag_never_share_a_name(store: VersionedStore):
    """lakeFS refuses either with 409 (pkg/catalog/catalog.go CreateBranch, CreateTag): the
    error must say which name clashed, not that the branch or tag already exists."""
    head = store.create_branch("run-1")
    with pytest.raises(StoreError, match="'run-1'.*a branch has that name"):
        store.create_tag("run-1", MAIN)
    store.create_tag("digits-v1", MAIN)
    with pytest.raises(StoreError, match="'digits-v1'.*a tag has that name"):
        store.create_branch("digits-v1")
    with pytest.raises(StoreError, match="a tag has that name"):
        store.create_branch("digits-v1", exist_ok=True)
    assert store.list_branches() == {MAIN: head, "run-1": head}
    assert store.list_tags() == {"digits-v1": head}


def test_tag_of_a_missing_ref_fails(store: VersionedStore):
    with pytest.raises(RefNotFoundError):
        store.create_tag("v1", "no-such-branch")


def test_log_lists_reachable_commits_newest_first(store: VersionedStore):
    initial = store.resolve_ref(MAIN)
    ids = [commit_file(store, MAIN, {"f": str(i).encode()}, message=f"c{i}") for i in range(3)]
    log = store.log(MAIN)
    assert [c.id for c in log] == [ids[2], ids[1], ids[0], initial]
    assert [c.message for c in log[:3]] == ["c2", "c1", "c0"]
    assert [c.id for c in store.log(MAIN, limit=2)] == [ids[2], ids[1]]
    assert [c.id for c in store.log(ids[0])] == [ids[0], initial]


def test_log_returns_every_commit_asked_for_past_a_page_of_1000(store: VersionedStore, monkeypatch):
    """lakeFS serves the log in pages of at most 1000, and its ``limit=true`` stops at one page
    with has_more=false: a client paging on it never sees commit 1001. Housekeeping needs all
    of main, so it must see every commit, or refuse to plan."""
    # 1001 empty commits in seconds: the local twin's fsyncs are not what this test is about.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    ids = [store.resolve_ref(MAIN)] + [store.commit(MAIN, f"c{i}", allow_empty=True).id for i in range(1001)]
    newest_first = ids[::-1]
    assert [c.id for c in store.log(MAIN, limit=1001)] == newest_first[:1001]
    assert [c.id for c in store.log(MAIN, limit=1000)] == newest_first[:1000]
    assert [c.id for c in store.log(MAIN, limit=5000)] == newest_first
    assert housekeeping.main_commit_ids(store) == set(ids)
    monkeypatch.setattr(housekeeping, "MAIN_LOG_LIMIT", 1001)
    with pytest.raises(HousekeepingError, match="more than 1,001 commits.*plans nothing"):
        housekeeping.main_commit_ids(store)


def test_log_after_merge_contains_both_lines(store: VersionedStore):
    store.create_branch("run-1")
    run = commit_file(store, "run-1", {"r": b"1"})
    main = commit_file(store, MAIN, {"m": b"1"})
    merged = store.merge("run-1", MAIN)
    log_ids = [c.id for c in store.log(MAIN)]
    assert log_ids[0] == merged
    assert {run, main} <= set(log_ids)


def test_diff_reports_added_removed_and_changed(store: VersionedStore):
    left = commit_file(store, MAIN, {"keep": b"k", "remove": b"r", "change": b"c1", "sub/x": b"x"})
    store.delete_object(MAIN, "remove")
    store.put_object(MAIN, "change", b"c2")
    store.put_object(MAIN, "add", b"a")
    store.put_object(MAIN, "sub/y", b"y")
    right = store.commit(MAIN, "changes").id
    assert [(d.path, d.type) for d in store.diff(left, right)] == [
        ("add", "added"), ("change", "changed"), ("remove", "removed"), ("sub/y", "added"),
    ]
    assert [(d.path, d.type) for d in store.diff(left, right, prefix="sub/")] == [("sub/y", "added")]
    assert store.diff(right, right) == []
    assert [(d.path, d.type) for d in store.diff(right, left, prefix="r")] == [("remove", "added")]


def test_resolve_ref_accepts_branch_tag_and_commit(store: VersionedStore):
    commit = commit_file(store, MAIN, {"x": b"1"})
    store.create_tag("v1", commit)
    assert store.resolve_ref(MAIN) == store.resolve_ref("v1") == store.resolve_ref(commit) == commit
    with pytest.raises(RefNotFoundError):
        store.resolve_ref("nope")
    with pytest.raises(RefNotFoundError):
        store.resolve_ref("0" * 64)


# --- pinned reads -------------------------------------------------------------------------------

def test_pinned_location_reads_the_commit_even_after_main_moves(store: VersionedStore, store_credentials):
    pinned = commit_file(store, MAIN, {"shards/train-0.bin": b"old shard"})
    location = store.pinned_location(pinned, "shards/train-0.bin")
    assert read_location(location, store_credentials) == b"old shard"
    commit_file(store, MAIN, {"shards/train-0.bin": b"new shard"})
    store.put_object(MAIN, "shards/train-0.bin", b"uncommitted shard")
    assert store.pinned_location(pinned, "shards/train-0.bin").uri == location.uri
    assert read_location(location, store_credentials) == b"old shard"


def test_pinned_location_of_a_missing_object_fails(store: VersionedStore):
    commit = commit_file(store, MAIN, {"x": b"1"})
    with pytest.raises(RefNotFoundError):
        store.pinned_location(commit, "missing.bin")


# --- validation --------------------------------------------------------------------------------

# lakeFS's own rules (pkg/graveler/validate.go): branch ids are letters, digits, '_' and '-';
# tag ids follow git's check-ref-format, so release tags with dots are fine. Beyond lakeFS the
# platform bounds names to MAX_REF_BYTES and keeps a leading '.' off tags (base.py says why).
BAD_BRANCH_NAMES = ["", "has/slash", "has.dot", "v1.0.0", "-leading-dash", "sp ace", "x" * (MAX_REF_BYTES + 1), "ü"]
BAD_TAG_NAMES = ["", "has/slash", "two..dots", "ends.", "x.lock", "sp ace", "tab\t", "@", "a@{b", "a^b", "a:b",
                 "a?b", "a*b", "a[b", "back\\slash", ".hidden", "x" * (MAX_REF_BYTES + 1)]
GOOD_TAG_NAMES = ["v1.0.0", "release-2024.06.01", "-rc1", "digits-v1", "ü-1.2"]


@pytest.mark.parametrize("name", BAD_BRANCH_NAMES)
def test_invalid_branch_names_are_refused(store: VersionedStore, name: str):
    with pytest.raises(StoreError, match="invalid branch name"):
        store.create_branch(name)
    assert list(store.list_branches()) == [MAIN]


@pytest.mark.parametrize("name", BAD_TAG_NAMES)
def test_invalid_tag_names_are_refused(store: VersionedStore, name: str):
    with pytest.raises(StoreError, match="invalid tag name"):
        store.create_tag(name, MAIN)
    assert store.list_tags() == {}


@pytest.mark.parametrize("tag", GOOD_TAG_NAMES)
def test_tags_take_every_name_lakefs_takes(store: VersionedStore, tag: str):
    commit = commit_file(store, MAIN, {"weights.pt": b"w1"})
    assert store.create_tag(tag, MAIN) == commit
    assert store.list_tags() == {tag: commit}
    assert store.resolve_ref(tag) == commit
    assert store.get_object(tag, "weights.pt") == b"w1"
    assert [o.path for o in store.list_objects(tag)] == ["weights.pt"]
    assert store.pinned_location(tag, "weights.pt").extra["commit_id"] == commit
    store.delete_tag(tag)
    assert store.list_tags() == {}


@pytest.mark.parametrize("path", ["", "/abs/path", "../escape", "a/../b", "a//b", "a/./b", "dir/", "ctl\x01", "back\\slash"])
def test_invalid_object_paths_are_refused(store: VersionedStore, path: str):
    with pytest.raises(StoreError, match="invalid object path"):
        store.put_object(MAIN, path, b"x")
    with pytest.raises(StoreError, match="invalid object path"):
        store.get_object(MAIN, path)
    assert not store.has_uncommitted_changes(MAIN)


def test_put_object_refuses_text(store: VersionedStore):
    with pytest.raises(StoreError, match="bytes"):
        store.put_object(MAIN, "x.txt", "text")  # type: ignore[arg-type]
