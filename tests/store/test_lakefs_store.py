"""lakeFS-only promises, checked with the unmodified SDK over real HTTP against the test server:
bounded retries on transient faults, reconciled retries of applied writes, clear errors, no
leaked secrets."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lakefs_sdk
import pytest
from lakefs_sdk.client import LakeFSClient

from resources.store.base import MAIN, RefNotFoundError, StoreError
from resources.store.factory import make_store
from resources.store.lakefs import LakeFSVersionedStore
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.ports import free_ports
from tests.support.store_backends import fresh_repository_name, make_lakefs_store

PLANTED_SECRET = "planted-LAKEFS-secret-9f8e7d6c5b4a"
FAULTS = ["503", "500", "reset", "stall"]


@pytest.fixture
def faulty(lakefs_server: LakeFSTestServer):
    """A fresh repository whose client times out after 1 s and tries each call 3 times."""
    store = make_lakefs_store(lakefs_server, read_timeout_s=1)
    store.ensure_repository()
    proxy = lakefs_server.proxy
    proxy.clear()
    proxy.reset_counters()
    yield store, proxy
    proxy.clear()


@pytest.mark.parametrize("fault", FAULTS)
def test_reads_and_writes_survive_transient_faults(faulty, fault):
    store, proxy = faulty
    proxy.inject(fault, 2)
    store.put_object(MAIN, "data.bin", b"payload")
    proxy.inject(fault, 2)
    commit = store.commit(MAIN, "write data", {"k": "v"})
    proxy.inject(fault, 2)
    assert store.get_object(commit.id, "data.bin") == b"payload"
    assert proxy.faults_served == [fault] * 6
    assert [c.message for c in store.log(MAIN)] == ["write data", "Repository created"]


@pytest.mark.parametrize("fault", ["503", "reset", "stall"])
def test_persistent_faults_give_up_after_the_bounded_attempts(faulty, fault):
    store, proxy = faulty
    proxy.inject(fault, 100)
    proxy.reset_counters()
    with pytest.raises(StoreError, match=r"kept failing after 3 attempts.*check that the server is up") as info:
        store.list_branches()
    assert proxy.requests_seen == 3
    assert store.endpoint in str(info.value)
    proxy.clear()
    assert list(store.list_branches()) == [MAIN]


def test_a_commit_applied_before_the_connection_dropped_is_not_repeated(faulty):
    store, proxy = faulty
    store.put_object(MAIN, "a", b"1")
    proxy.inject("reset-after", 1)
    commit = store.commit(MAIN, "once", {"run": "r1"})
    assert proxy.faults_served == ["reset-after"]
    assert store.resolve_ref(MAIN) == commit.id
    assert [c.message for c in store.log(MAIN)] == ["once", "Repository created"]


def test_a_merge_applied_before_the_connection_dropped_returns_its_commit(faulty):
    store, proxy = faulty
    store.create_branch("run-1")
    store.put_object("run-1", "a", b"1")
    source = store.commit("run-1", "a").id
    proxy.inject("reset-after", 1)
    head = store.merge("run-1", MAIN, metadata={"run": "r1"})
    assert head == store.resolve_ref(MAIN)
    assert source in store.get_commit(head).parents
    assert store.get_object(MAIN, "a") == b"1"


def test_branch_tag_and_delete_applied_before_the_connection_dropped(faulty):
    store, proxy = faulty
    proxy.inject("reset-after", 1)
    head = store.create_branch("run-1")
    assert store.list_branches()["run-1"] == head
    proxy.inject("reset-after", 1)
    assert store.create_tag("v1", MAIN) == head
    proxy.inject("reset-after", 1)
    store.delete_branch("run-1")
    proxy.inject("reset-after", 1)
    store.delete_tag("v1")
    assert proxy.faults_served == ["reset-after"] * 4
    assert list(store.list_branches()) == [MAIN]
    assert store.list_tags() == {}


def test_a_large_file_streams_up_and_down_in_chunks(lakefs_store: LakeFSVersionedStore, lakefs_server, tmp_path: Path):
    data = os.urandom(17 * 1024 * 1024 + 5)  # three 8 MiB download ranges
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    lakefs_store.put_file(MAIN, "big.bin", src)
    commit = lakefs_store.commit(MAIN, "big")
    lakefs_server.proxy.reset_counters()
    out = lakefs_store.download(commit.id, "big.bin", tmp_path / "out.bin")
    assert out.read_bytes() == data
    assert lakefs_server.proxy.requests_seen == 1 + 3  # one stat, three ranges


def test_wrong_credentials_fail_at_once_naming_the_key_not_the_secret(lakefs_server, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    store = LakeFSVersionedStore(
        endpoint=lakefs_server.endpoint, access_key_id="AKIAWRONGKEY", secret_access_key=PLANTED_SECRET,
        repository=fresh_repository_name(), storage_namespace="local://x", max_attempts=3, backoff_s=0.01,
    )
    lakefs_server.proxy.reset_counters()
    with pytest.raises(StoreError, match="refused access key id 'AKIAWRONGKEY'.*HTTP 401") as info:
        store.ensure_repository()
    assert lakefs_server.proxy.requests_seen == 1  # a client error is not retried
    lakefs_server.proxy.inject("503", 10)
    with pytest.raises(StoreError) as after_faults:
        store.list_tags()
    lakefs_server.proxy.clear()
    captured = capsys.readouterr()
    texts = [repr(store), str(store), str(store.describe()), str(info.value), repr(info.value),
             str(after_faults.value), caplog.text, captured.out, captured.err, str(vars(store))]
    assert not [t for t in texts if PLANTED_SECRET in t]


def test_unreachable_endpoint_names_it(tmp_path: Path):
    [port] = free_ports(1)
    store = LakeFSVersionedStore(f"http://127.0.0.1:{port}", "key", PLANTED_SECRET, "repo-x",
                                 max_attempts=2, backoff_s=0.01, connect_timeout_s=1)
    with pytest.raises(StoreError, match=f"127.0.0.1:{port} kept failing after 2 attempts.*connection refused"):
        store.list_branches()


def test_retries_span_at_least_half_the_exponential_schedule():
    """Equal jitter: whatever the random draws, five attempts wait at least 0.25+0.5+1+2 s
    (a store restart of a few seconds is ridden out) and at most twice that."""
    store = LakeFSVersionedStore("http://127.0.0.1:1", "key", PLANTED_SECRET, "repo-x")
    for _ in range(200):
        delays = [store._backoff(a) for a in range(1, store.max_attempts)]
        assert all(0.5 * 2 ** (a - 1) / 2 <= d <= 0.5 * 2 ** (a - 1) for a, d in enumerate(delays, 1))
        assert 3.75 <= sum(delays) <= 7.5
    capped = LakeFSVersionedStore("http://127.0.0.1:1", "key", PLANTED_SECRET, "repo-x", max_backoff_s=1.0)
    assert 0.5 <= capped._backoff(9) <= 1.0


def test_a_missing_repository_without_namespace_says_what_to_pass(lakefs_server):
    store = make_lakefs_store(lakefs_server)
    store.storage_namespace = None
    with pytest.raises(StoreError, match="storage_namespace"):
        store.ensure_repository()
    with pytest.raises(RefNotFoundError):
        store.list_branches()


def test_pinned_location_and_ui_link_point_at_lakefs(lakefs_store: LakeFSVersionedStore):
    lakefs_store.put_object(MAIN, "shards/0.bin", b"s")
    commit = lakefs_store.commit(MAIN, "shards")
    location = lakefs_store.pinned_location(commit.id, "shards/0.bin")
    assert location.uri == f"s3://{lakefs_store.repository}/{commit.id}/shards/0.bin"
    assert location.s3_endpoint_url == lakefs_store.endpoint
    assert lakefs_store.ui_link(commit.id) == (
        f"{lakefs_store.endpoint}/repositories/{lakefs_store.repository}/objects?ref={commit.id}")
    with pytest.raises(StoreError, match="moving branch"):
        lakefs_store.pinned_location(MAIN, "shards/0.bin")


def test_pinned_locations_of_many_shards_cost_one_request_each(lakefs_store: LakeFSVersionedStore, lakefs_server):
    for i in range(5):
        lakefs_store.put_object(MAIN, f"shards/{i}.bin", b"s")
    commit = lakefs_store.commit(MAIN, "shards").id
    lakefs_store.pinned_location(commit, "shards/0.bin")
    lakefs_server.proxy.reset_counters()
    uris = [lakefs_store.pinned_location(commit, f"shards/{i}.bin").uri for i in range(1, 5)]
    assert lakefs_server.proxy.requests_seen == 4
    assert len(set(uris)) == 4


def test_endpoint_with_api_suffix_is_normalised(lakefs_server):
    store = make_lakefs_store(lakefs_server)
    same = LakeFSVersionedStore(f"{lakefs_server.endpoint}/api/v1/", "k", "s", store.repository)
    assert same.endpoint == store.endpoint


def test_factory_builds_the_lakefs_store(lakefs_server):
    store = make_store("lakefs", endpoint=lakefs_server.endpoint, access_key_id=lakefs_server.access_key_id,
                       secret_access_key=lakefs_server.secret_access_key, repository=fresh_repository_name(),
                       storage_namespace="local://f", max_attempts=2)
    assert isinstance(store, LakeFSVersionedStore)
    store.ensure_repository()
    assert list(store.list_branches()) == [MAIN]
    with pytest.raises(StoreError, match="secret_access_key"):
        make_store("lakefs", endpoint="http://x", access_key_id="k", repository="repo-x")
    with pytest.raises(StoreError, match="bad settings"):
        make_store("lakefs", endpoint="http://x", access_key_id="k", secret_access_key="s",
                   repository="repo-x", colour="blue")


def test_server_answers_deserialize_into_the_sdk_models(lakefs_store: LakeFSVersionedStore, lakefs_server):
    """The server's JSON is what lakeFS's OpenAPI spec says: the SDK's own models accept it."""
    conf = lakefs_sdk.Configuration(host=f"{lakefs_server.direct_endpoint}/api/v1",
                                    username=lakefs_server.access_key_id, password=lakefs_server.secret_access_key)
    sdk = LakeFSClient(conf)
    repo = lakefs_store.repository
    lakefs_store.put_object(MAIN, "a.txt", b"a")
    assert isinstance(sdk.repositories_api.get_repository(repo), lakefs_sdk.Repository)
    assert isinstance(sdk.branches_api.diff_branch(repo, MAIN), lakefs_sdk.DiffList)
    assert isinstance(sdk.objects_api.stat_object(repo, MAIN, "a.txt"), lakefs_sdk.ObjectStats)
    assert isinstance(sdk.objects_api.list_objects(repo, MAIN), lakefs_sdk.ObjectStatsList)
    commit = sdk.commits_api.commit(repo, MAIN, lakefs_sdk.CommitCreation(message="m", metadata={"k": "v"}))
    assert isinstance(commit, lakefs_sdk.Commit) and commit.metadata == {"k": "v"}
    assert isinstance(sdk.refs_api.log_commits(repo, MAIN), lakefs_sdk.CommitList)
    assert isinstance(sdk.branches_api.list_branches(repo), lakefs_sdk.RefList)
    assert isinstance(sdk.branches_api.get_branch(repo, MAIN), lakefs_sdk.Ref)
    assert isinstance(sdk.tags_api.create_tag(repo, lakefs_sdk.TagCreation(id="t1", ref=commit.id)), lakefs_sdk.Ref)
    assert isinstance(sdk.refs_api.diff_refs(repo, commit.parents[0], commit.id), lakefs_sdk.DiffList)
    sdk.branches_api.create_branch(repo, lakefs_sdk.BranchCreation(name="b1", source=MAIN))
    lakefs_store.put_object("b1", "b.txt", b"b")
    lakefs_store.commit("b1", "b")
    result = sdk.refs_api.merge_into_branch(repo, "b1", MAIN, lakefs_sdk.Merge(message="merge"))
    assert isinstance(result, lakefs_sdk.MergeResult)
    with pytest.raises(lakefs_sdk.exceptions.NotFoundException):
        sdk.commits_api.get_commit(repo, "no-such-ref")
