"""Copies inside the store (``copy_object``) on every backend, and on lakeFS with no byte through
the client.

A re-execution from failure carries the first run's raw copy onto its own branch, and a new image
version takes parts from the previous one's commit or an earlier attempt's branch: those are
copies from one ref to a branch. Done by the store, a terabyte corpus moves no byte through the
step; the copy must still be an object of its own, exactly as ``put_file`` of the bytes would be.
"""

from __future__ import annotations

import hashlib
import json

import lakefs_sdk
import pytest

from resources.store.base import MAIN, RefNotFoundError, StoreError, VersionedStore
from resources.store.local import LocalVersionedStore
from tests.store.test_lakefs_server import raw_request, sdk, upload_head
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.store_backends import fresh_repository_name

DATA = bytes(range(256)) * 300 + b"tail"  # 76804 bytes


@pytest.fixture
def repo(lakefs_server: LakeFSTestServer) -> str:
    name = fresh_repository_name()
    sdk(lakefs_server).repositories_api.create_repository(
        lakefs_sdk.RepositoryCreation(name=name, storage_namespace=f"local://{name}"))
    return name


@pytest.fixture
def source(store: VersionedStore) -> str:
    store.put_object(MAIN, "raw/part-0.parquet", DATA)
    return store.commit(MAIN, "the raw copy").id


def test_a_copy_from_a_commit_is_staged_on_the_branch_with_the_same_bytes(store, source):
    store.create_branch("run-2", MAIN)
    store.delete_object("run-2", "raw/part-0.parquet")
    store.commit("run-2", "a run that lost the part")

    info = store.copy_object(source, "raw/part-0.parquet", "run-2")

    assert (info.path, info.size_bytes) == ("raw/part-0.parquet", len(DATA))
    assert info.checksum == store.stat_object(source, "raw/part-0.parquet").checksum
    assert store.get_object("run-2", "raw/part-0.parquet") == DATA
    assert [(d.path, d.type) for d in store.uncommitted_diff("run-2")] == [("raw/part-0.parquet", "added")]
    assert store.get_object(store.commit("run-2", "carried").id, "raw/part-0.parquet") == DATA


def test_a_copy_to_another_path_reads_a_branchs_uncommitted_object(store, source):
    store.create_branch("attempt-1", MAIN)
    store.put_object("attempt-1", "shards/train-0.bin", b"staged by an earlier attempt")
    store.create_branch("attempt-2", MAIN)

    info = store.copy_object("attempt-1", "shards/train-0.bin", "attempt-2", "shards/train-0-copy.bin")

    assert info.path == "shards/train-0-copy.bin"
    assert store.get_object("attempt-2", "shards/train-0-copy.bin") == b"staged by an earlier attempt"
    assert not store.exists("attempt-2", "shards/train-0.bin")
    assert not store.exists(MAIN, "shards/train-0-copy.bin")


def test_a_later_write_to_either_path_leaves_the_other(store, source):
    store.copy_object(source, "raw/part-0.parquet", MAIN, "raw/copy.parquet")
    store.put_object(MAIN, "raw/copy.parquet", b"rewritten copy")
    assert store.get_object(MAIN, "raw/part-0.parquet") == DATA
    assert store.get_object(source, "raw/part-0.parquet") == DATA

    store.copy_object(source, "raw/part-0.parquet", MAIN, "raw/copy-2.parquet")
    store.put_object(MAIN, "raw/part-0.parquet", b"rewritten source")
    store.delete_object(MAIN, "raw/part-0.parquet")
    assert store.get_object(MAIN, "raw/copy-2.parquet") == DATA


def test_a_copy_names_a_missing_source_or_a_destination_that_is_no_branch(store, source):
    store.create_tag("release1", source)
    with pytest.raises(RefNotFoundError, match="part-9.parquet"):
        store.copy_object(source, "raw/part-9.parquet", MAIN)
    with pytest.raises(RefNotFoundError, match="not a branch"):
        store.copy_object(source, "raw/part-0.parquet", "release1", "raw/other.parquet")
    with pytest.raises(RefNotFoundError, match="not a branch"):
        store.copy_object(source, "raw/part-0.parquet", source, "raw/other.parquet")
    with pytest.raises(StoreError, match="invalid branch name 'v1.0.0'"):
        store.copy_object(source, "raw/part-0.parquet", "v1.0.0")  # a tag's name no branch can have
    with pytest.raises(StoreError, match="'..' components"):
        store.copy_object(source, "raw/part-0.parquet", MAIN, "raw/../escape")
    assert not store.has_uncommitted_changes(MAIN)


class _ThroughTheClient(LocalVersionedStore):
    """A store without a copy of its own: the interface's default (download, then put_file)."""

    copy_object = VersionedStore.copy_object


def test_the_default_copy_for_a_store_without_one_keeps_the_same_semantics(tmp_path):
    store = _ThroughTheClient(tmp_path / "store", fresh_repository_name())
    store.ensure_repository()
    store.put_object(MAIN, "raw/part-0.parquet", DATA)
    source = store.commit(MAIN, "the raw copy").id
    store.create_tag("release1", source)

    info = store.copy_object(source, "raw/part-0.parquet", MAIN, "raw/copy.parquet")

    assert (info.size_bytes, info.checksum) == (len(DATA), hashlib.sha256(DATA).hexdigest())
    store.put_object(MAIN, "raw/copy.parquet", b"rewritten")
    assert store.get_object(MAIN, "raw/part-0.parquet") == DATA
    with pytest.raises(RefNotFoundError):
        store.copy_object(source, "raw/part-9.parquet", MAIN)
    with pytest.raises(RefNotFoundError):
        store.copy_object(source, "raw/part-0.parquet", "release1", "raw/other.parquet")


def test_the_local_store_shares_the_blob_and_writes_no_new_one(local_store):
    local_store.put_object(MAIN, "raw/part-0.parquet", DATA)
    source = local_store.commit(MAIN, "the raw copy").id
    blobs = sorted((local_store.repo_dir / "objects").rglob("*"))

    local_store.copy_object(source, "raw/part-0.parquet", MAIN, "raw/copy.parquet")

    assert sorted((local_store.repo_dir / "objects").rglob("*")) == blobs
    assert local_store.object_file(source, "raw/part-0.parquet") == \
        local_store.object_file(local_store.commit(MAIN, "copied").id, "raw/copy.parquet")


def test_lakefs_copies_on_the_server_and_serves_no_byte(lakefs_store, lakefs_server):
    path = f"raw/{fresh_repository_name()}.parquet"  # the server's byte counter is by path, session-wide
    lakefs_store.put_object(MAIN, path, DATA)
    source = lakefs_store.commit(MAIN, "the raw copy").id
    lakefs_store.create_branch("run-2", MAIN)
    lakefs_store.delete_object("run-2", path)
    lakefs_store.commit("run-2", "a run that lost the part")
    before = lakefs_server.served(path)
    lakefs_server.proxy.reset_counters()
    lakefs_server.inject("503", 2)  # fewer than the store's 3 attempts: a retried copy is the same copy
    try:
        lakefs_store.copy_object(source, path, "run-2")
        assert lakefs_server.proxy.faults_served == ["503", "503"]
    finally:
        lakefs_server.proxy.reset_counters()  # the server is the session's: leave no count to another test
    assert lakefs_server.served(path) == before
    assert [(d.path, d.type) for d in lakefs_store.uncommitted_diff("run-2")] == [(path, "added")]
    assert lakefs_store.get_object("run-2", path) == DATA


def test_the_test_server_answers_a_copy_as_lakefs_does(lakefs_server, repo):
    """pkg/api/controller.go CopyObject: 201 and the copy's ObjectStats (a physical address of its
    own, the source's checksum, size, content type and metadata); 404 for a missing source and
    for a destination that is no branch; 400 for what the request validator refuses."""
    client = sdk(lakefs_server)
    served = lakefs_server.served("a.bin")
    uploaded = raw_request(lakefs_server, upload_head(repo, "a.bin", "Content-Length: 12\r\n"), b"source bytes")
    assert uploaded[0] == 201
    head = client.commits_api.commit(repo, MAIN, lakefs_sdk.CommitCreation(message="a")).id
    client.tags_api.create_tag(repo, lakefs_sdk.TagCreation(id="release1", ref=head))
    source = client.objects_api.stat_object(repo, MAIN, "a.bin")

    copy = client.objects_api.copy_object(repo, MAIN, "b.bin", lakefs_sdk.ObjectCopyCreation(src_path="a.bin"))
    assert (copy.path, copy.path_type, copy.checksum, copy.size_bytes, copy.content_type, copy.metadata) == \
        ("b.bin", "object", source.checksum, source.size_bytes, source.content_type, source.metadata)
    assert copy.physical_address != source.physical_address and copy.mtime >= source.mtime

    def post(branch: str, query: str, body: dict) -> tuple[int, dict]:
        data = json.dumps(body).encode()
        return raw_request(lakefs_server, f"POST /api/v1/repositories/{repo}/branches/{branch}/objects/copy{query} "
                           "HTTP/1.1\r\nHost: lakefs\r\nAuthorization: Basic {auth}\r\nContent-Type: "
                           f"application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n", data)

    assert post(MAIN, "?dest_path=c.bin", {"src_path": "a.bin", "src_ref": head})[0] == 201
    assert post(MAIN, "?dest_path=c.bin", {"src_path": "nothing.bin", "src_ref": head}) == \
        (404, {"message": "not found"})
    assert post("release1", "?dest_path=c.bin", {"src_path": "a.bin"}) == \
        (404, {"message": "branch 'release1' not found"})
    assert post(head, "?dest_path=c.bin", {"src_path": "a.bin"}) == (404, {"message": f"branch '{head}' not found"})
    assert post("v1.0", "?dest_path=c.bin", {"src_path": "a.bin"})[0] == 400  # no branch id
    status, answer = post(MAIN, "", {"src_path": "a.bin"})
    assert status == 400 and "dest_path" in answer["message"]
    status, answer = post(MAIN, "?dest_path=c.bin", {"src_ref": head})
    assert status == 400 and "src_path" in answer["message"]
    assert lakefs_server.served("a.bin") == served
