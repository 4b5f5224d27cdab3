"""lakeFS's object identity, probed as a user meets it, on every backend.

lakeFS compares object versions by size, ETag, user metadata and content type only
(pkg/catalog/entry.go ``EntryToValue``), never by physical address or mtime. So the same bytes
uploaded again are no change: the uncommitted diff skips them (uncommitted_diff_iterator.go), a
commit keeps the committed record and answers 400 "no changes" (committed/commit.go), and a merge
takes them without a conflict (committed/merge.go). The platform's local store agrees (it is
content addressed), and ``ops/runs.py`` ``commit_or_head`` relies on it. These probes run on the
local store, on the lakeFS test server and, when LAKEFS_ENDPOINT is set, on a real lakeFS, so the
test server cannot send the platform down a path real lakeFS would not.

The rest are the API details a user meets directly: ``amount`` above 1000 refused on every list
endpoint (api/swagger.yml ``PaginationAmount``), and the committer recorded as the user's email
or username (pkg/auth/model/model.go ``User.Committer``), not the access key id.
"""

from __future__ import annotations

import base64
import http.client
import json
from pathlib import Path
from urllib.parse import quote, urlencode, urlparse

import pytest

from ops.runs import commit_or_head
from resources.store.base import MAIN, MergeConflictError, StoreError
from resources.store.lakefs import LakeFSVersionedStore
from tests.support.lakefs_server import TEST_USER_ID, LakeFSTestServer
from tests.support.store_backends import make_lakefs_store

DATA = b"the same bytes, uploaded twice\n" * 64


# --- the platform's view: every VersionedStore ------------------------------------------------------

def committed(store, branch: str, files: dict[str, bytes], message: str = "data") -> str:
    for path, data in files.items():
        store.put_object(branch, path, data)
    return store.commit(branch, message).id


def test_the_same_bytes_uploaded_again_are_no_uncommitted_change(store):
    head = committed(store, MAIN, {"data/a.bin": DATA})
    store.put_object(MAIN, "data/a.bin", DATA)
    assert store.uncommitted_diff(MAIN) == []
    assert store.has_uncommitted_changes(MAIN) is False
    with pytest.raises(StoreError, match="nothing to commit"):
        store.commit(MAIN, "the same bytes again")
    assert store.resolve_ref(MAIN) == head


def test_an_empty_commit_over_the_same_bytes_changes_nothing(store):
    parent = committed(store, MAIN, {"data/a.bin": DATA})
    store.put_object(MAIN, "data/a.bin", DATA)
    head = store.commit(MAIN, "allowed empty", allow_empty=True)
    assert head.parents == (parent,)
    assert store.diff(parent, head.id) == []


def test_identical_changes_on_both_sides_merge_without_a_conflict(store):
    committed(store, MAIN, {"data/a.bin": b"v1"})
    for side in ("left", "right"):
        store.create_branch(side, MAIN)
        committed(store, side, {"data/a.bin": DATA, "data/new.bin": DATA}, f"{side}: the same change")
    store.merge("left", MAIN)
    store.merge("right", MAIN)  # both added and changed the same paths to the same bytes
    assert store.get_object(MAIN, "data/a.bin") == DATA and store.get_object(MAIN, "data/new.bin") == DATA


def test_a_reupload_beside_a_change_is_no_side_of_a_conflict(store):
    committed(store, MAIN, {"data/a.bin": b"v1"})
    store.create_branch("feature", MAIN)
    store.put_object("feature", "data/a.bin", b"v1")  # unchanged by identity
    committed(store, "feature", {"data/b.bin": DATA}, "feature: b, and a uploaded again")
    committed(store, MAIN, {"data/a.bin": b"v2"}, "main: a changed")
    store.merge("feature", MAIN)
    assert store.get_object(MAIN, "data/a.bin") == b"v2" and store.get_object(MAIN, "data/b.bin") == DATA


def test_different_bytes_on_both_sides_still_conflict(store):
    """The probes above are not passing because nothing ever conflicts."""
    committed(store, MAIN, {"data/a.bin": b"v1"})
    store.create_branch("feature", MAIN)
    committed(store, "feature", {"data/a.bin": b"feature"})
    committed(store, MAIN, {"data/a.bin": b"main"})
    with pytest.raises(MergeConflictError) as info:
        store.merge("feature", MAIN)
    assert info.value.paths == ["data/a.bin"]


def test_commit_or_head_takes_the_head_when_the_same_data_is_written_again(store):
    """ops/runs.py: a run that writes what the branch already holds makes no commit."""
    initial = store.resolve_ref(MAIN)
    store.put_object(MAIN, "data/a.bin", DATA)
    written = commit_or_head(store, MAIN, "write a", {"run": "1"})
    assert written != initial and store.get_commit(written).message == "write a"
    store.put_object(MAIN, "data/a.bin", DATA)  # a retry, or a rerun on the same data
    again = commit_or_head(store, MAIN, "write a again", {"run": "2"})
    assert again == written == store.resolve_ref(MAIN)
    assert "write a again" not in [c.message for c in store.log(MAIN)]
    store.put_object(MAIN, "data/a.bin", DATA + b"more")
    changed = commit_or_head(store, MAIN, "write a changed", {"run": "3"})
    assert store.get_commit(changed).parents == (written,)


# --- lakeFS's API as a user (lakectl, the UI, the SDK) meets it -------------------------------------

class LakeFSAPI:
    """Raw REST calls with basic auth, as lakectl or curl make them: no client-side checks."""

    def __init__(self, store: LakeFSVersionedStore):
        self.store = store
        self.repo = store.repository
        key_id, secret = store._test_gateway_credentials
        self.auth = "Basic " + base64.b64encode(f"{key_id}:{secret}".encode()).decode()
        self.url = urlparse(store.endpoint)

    def call(self, method: str, path: str, query: dict | None = None, body: bytes | dict | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict]:
        if isinstance(body, dict):
            body, headers = json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        target = f"{self.url.path.rstrip('/')}/api/v1{path}" + (f"?{urlencode(query)}" if query else "")
        conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=30)
        try:
            conn.request(method, target, body=body, headers={"Authorization": self.auth, **(headers or {})})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"text": raw.decode("utf-8", "replace")}
        return response.status, answer

    def upload(self, branch: str, path: str, data: bytes, content_type: str = "application/octet-stream",
               metadata: dict[str, str] | None = None) -> dict:
        headers = {"Content-Type": content_type, **{f"X-Lakefs-Meta-{k}": v for k, v in (metadata or {}).items()}}
        status, stats = self.call("POST", f"/repositories/{self.repo}/branches/{quote(branch)}/objects",
                                  {"path": path}, data, headers)
        assert status == 201, stats
        return stats

    def commit(self, branch: str, message: str, allow_empty: bool = False) -> tuple[int, dict]:
        return self.call("POST", f"/repositories/{self.repo}/branches/{quote(branch)}/commits",
                         body={"message": message, "allow_empty": allow_empty})

    def uncommitted(self, branch: str) -> list[tuple[str, str]]:
        status, page = self.call("GET", f"/repositories/{self.repo}/branches/{quote(branch)}/diff")
        assert status == 200, page
        return [(d["path"], d["type"]) for d in page["results"]]

    def stat(self, ref: str, path: str) -> dict:
        status, stats = self.call("GET", f"/repositories/{self.repo}/refs/{quote(ref)}/objects/stat", {"path": path})
        assert status == 200, stats
        return stats


@pytest.fixture(params=["lakefs", "real-lakefs"])
def lakefs_api(request: pytest.FixtureRequest) -> LakeFSAPI:
    """A fresh repository on the lakeFS test server and, when configured, on a real lakeFS."""
    return LakeFSAPI(request.getfixturevalue(f"{request.param.replace('-', '_')}_store"))


def test_a_commit_of_the_same_bytes_answers_400_no_changes(lakefs_api):
    first = lakefs_api.upload(MAIN, "a.bin", DATA)
    status, head = lakefs_api.commit(MAIN, "first")
    assert status == 201, head
    again = lakefs_api.upload(MAIN, "a.bin", DATA)
    assert again["checksum"] == first["checksum"]
    assert lakefs_api.uncommitted(MAIN) == []
    status, answer = lakefs_api.commit(MAIN, "the same bytes again")
    assert (status, answer["message"]) == (400, "commit: no changes")
    # An allowed empty commit keeps the committed record: the first upload's address.
    status, empty = lakefs_api.commit(MAIN, "allowed empty", allow_empty=True)
    assert status == 201 and empty["meta_range_id"] == head["meta_range_id"]
    assert lakefs_api.stat(empty["id"], "a.bin")["physical_address"] == first["physical_address"]


@pytest.mark.parametrize("other", [{"content_type": "text/plain"}, {"metadata": {"owner": "team-a"}}],
                         ids=["content-type", "user-metadata"])
def test_content_type_and_user_metadata_are_part_of_identity(lakefs_api, other):
    lakefs_api.upload(MAIN, "a.bin", DATA)
    assert lakefs_api.commit(MAIN, "first")[0] == 201
    lakefs_api.upload(MAIN, "a.bin", DATA, **other)
    assert lakefs_api.uncommitted(MAIN) == [("a.bin", "changed")]
    assert lakefs_api.commit(MAIN, "same bytes, other attributes")[0] == 201


LIST_ENDPOINTS = [
    "/repositories",
    "/repositories/{repo}/branches",
    "/repositories/{repo}/tags",
    "/repositories/{repo}/refs/main/objects/ls",
    "/repositories/{repo}/refs/main/commits",
    "/repositories/{repo}/refs/main/diff/main",
    "/repositories/{repo}/branches/main/diff",
]


@pytest.mark.parametrize("endpoint", LIST_ENDPOINTS)
def test_amount_is_refused_outside_swaggers_bounds(lakefs_api, endpoint):
    """api/swagger.yml PaginationAmount: minimum -1, maximum 1000, enforced with a 400."""
    path = endpoint.format(repo=lakefs_api.repo)
    for amount in (1001, 5000, -2):
        status, answer = lakefs_api.call("GET", path, {"amount": amount})
        assert status == 400, (amount, answer)
        assert "amount" in answer["message"], answer
    for amount in (1000, 1, 0, -1):
        status, answer = lakefs_api.call("GET", path, {"amount": amount})
        assert status == 200, (amount, answer)
        assert answer["pagination"]["max_per_page"] == 1000


def test_the_committer_is_the_users_email_or_name(lakefs_api):
    status, current = lakefs_api.call("GET", "/user")
    assert status == 200, current
    user = current["user"]
    lakefs_api.upload(MAIN, "a.bin", DATA)
    status, commit = lakefs_api.commit(MAIN, "who")
    assert status == 201, commit
    key_id = lakefs_api.store._test_gateway_credentials[0]
    assert commit["committer"] == (user.get("email") or user["id"]) != key_id


def test_the_test_servers_committer_is_its_users_email_when_it_has_one(tmp_path: Path):
    with LakeFSTestServer(tmp_path, user_email="tester@example.com") as server:
        store = make_lakefs_store(server)
        store.ensure_repository()
        api = LakeFSAPI(store)
        assert api.call("GET", "/user")[1]["user"] == {
            "id": TEST_USER_ID, "creation_date": 0, "friendly_name": "model-factory tests",
            "email": "tester@example.com"}
        status, commit = api.commit(MAIN, "who", allow_empty=True)
        assert (status, commit["committer"]) == (201, "tester@example.com")
        store.create_branch("side", MAIN)
        api.upload("side", "a.bin", DATA)
        assert api.commit("side", "side")[0] == 201
        status, answer = api.call("POST", f"/repositories/{api.repo}/refs/side/merge/{MAIN}", body={})
        assert status == 200, answer
        status, merge = api.call("GET", f"/repositories/{api.repo}/commits/{answer['reference']}")
        assert merge["committer"] == "tester@example.com"
