"""Who the audit trail names: the proxy's header only behind the proxy, the lakeFS user behind the
store's key, else the OS user marked as not authenticated; a typed name is only a note."""

from __future__ import annotations

import getpass
import json

import pytest

from core.identity import (
    AUTH_PROXY,
    LAKEFS,
    LAUNCH_RUN_TAG,
    LAUNCH_VERIFIED_TAG,
    LAUNCHED_BY_TAG,
    NOT_VERIFIED,
    OS_USER,
    Actor,
    IdentityRefused,
    audit_fields,
    check_identity_header,
    describe_entry,
    identity_from_header,
    inherited_identity_tags,
    launch_identity_tags,
    launcher_from_tags,
    os_actor,
    resolve_actor,
)
from core.registry import add_comment, list_comments, move_alias, read_alias
from resources.store.base import MAIN
from tests.cli.records import make_record
from tests.support.lakefs_server import TEST_USER_ID, LakeFSTestServer
from tests.support.store_backends import make_lakefs_store

HEADER = "X-Forwarded-Email"
ALICE = Actor("alice@example.com", AUTH_PROXY, True, "X-Forwarded-Email set by the authenticating proxy")


# --- the proxy's header --------------------------------------------------------------------------------

def test_behind_the_proxy_its_header_is_the_identity():
    actor = identity_from_header(" alice@example.com ", header=HEADER, trusted=True)
    assert (actor.user, actor.verified_by, actor.authenticated) == ("alice@example.com", AUTH_PROXY, True)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_behind_the_proxy_a_request_without_the_header_went_around_it_and_is_refused(value):
    with pytest.raises(IdentityRefused, match="did not come through the authenticating proxy"):
        identity_from_header(value, header=HEADER, trusted=True)


def test_without_the_proxy_a_header_is_forged_and_refused_and_none_means_not_verified():
    with pytest.raises(IdentityRefused, match="not configured behind the authenticating proxy"):
        identity_from_header("alice@example.com", header=HEADER, trusted=False)
    assert identity_from_header(None, header=HEADER, trusted=False) is None


@pytest.mark.parametrize("value", ["alice@example.com, mallory@example.com", "a\x00b", "x" * 300])
def test_a_header_that_is_not_one_identity_is_refused(value):
    with pytest.raises(IdentityRefused, match="not one identity"):
        identity_from_header(value, header=HEADER, trusted=True)


def test_only_headers_the_proxy_strips_from_clients_may_be_trusted():
    assert check_identity_header("x-forwarded-email") == "X-Forwarded-Email"
    # oauth2-proxy sets X-Auth-Request-* on responses only; a client's copy reaches the upstream untouched.
    with pytest.raises(ValueError, match="could send it through the proxy unchanged"):
        check_identity_header("X-Auth-Request-Email")


# --- the identity on run tags ------------------------------------------------------------------------------

def test_every_submission_overwrites_the_launch_tags_a_client_typed():
    assert launch_identity_tags(ALICE, "r1") == {LAUNCHED_BY_TAG: "alice@example.com", LAUNCH_VERIFIED_TAG: AUTH_PROXY,
                                                 LAUNCH_RUN_TAG: "r1"}
    nobody = launch_identity_tags(None, "r2")
    assert nobody[LAUNCH_VERIFIED_TAG] == NOT_VERIFIED and nobody[LAUNCHED_BY_TAG] != "alice@example.com"


def test_a_retry_keeps_its_parents_identity_and_nothing_else_inherits_one():
    parent = launch_identity_tags(ALICE, "r1")
    retry = {**parent, "dagster/parent_run_id": "r1"}
    assert inherited_identity_tags("r2", retry, parent) == parent
    # A backfill or sensor run whose tags claim a verified launcher has no verified parent.
    assert inherited_identity_tags("r3", parent, None)[LAUNCH_VERIFIED_TAG] == NOT_VERIFIED
    # A retry whose tags were changed from its parent's is not believed either.
    forged = {**retry, LAUNCHED_BY_TAG: "mallory@example.com"}
    assert inherited_identity_tags("r4", forged, parent)[LAUNCH_VERIFIED_TAG] == NOT_VERIFIED
    assert inherited_identity_tags("r5", retry, launch_identity_tags(None, "r1"))[LAUNCH_VERIFIED_TAG] == NOT_VERIFIED


def test_run_tags_name_a_launcher_only_where_the_coordinator_writes_them():
    tags = launch_identity_tags(ALICE, "r1")
    actor = launcher_from_tags(tags, coordinator_verifies=True)
    assert (actor.user, actor.verified_by) == ("alice@example.com", AUTH_PROXY) and "r1" in actor.detail
    # The same tags typed into a local instance's launchpad prove nothing.
    assert launcher_from_tags(tags, coordinator_verifies=False) is None
    assert launcher_from_tags(launch_identity_tags(None, "r1"), coordinator_verifies=True) is None


# --- the store's user, else the OS user ---------------------------------------------------------------------

def test_a_local_store_authenticates_nobody_so_the_os_user_is_recorded_as_not_authenticated(tmp_path):
    from tests.cli.records import store_with_versions

    actor = resolve_actor(store_with_versions(tmp_path))
    assert (actor.user, actor.verified_by, actor.authenticated) == (getpass.getuser(), OS_USER, False)
    assert actor.describe() == f"{getpass.getuser()} (OS user, not authenticated)"


@pytest.fixture(scope="module")
def lakefs(tmp_path_factory):
    with LakeFSTestServer(tmp_path_factory.mktemp("lakefs")) as server:
        store = make_lakefs_store(server)
        store.ensure_repository()
        yield store


def _register(store, model="toy", version=1):
    from core.registry import lineage_path, version_tag

    store.put_object(MAIN, lineage_path(model, version), json.dumps(make_record(version, model=model)).encode())
    store.create_tag(version_tag(model, version), store.commit(MAIN, f"Register {model} v{version}", {}).id)


def test_on_lakefs_the_user_behind_the_key_is_recorded_and_a_ui_launcher_keeps_it_as_writer(lakefs):
    actor = resolve_actor(lakefs)
    assert (actor.user, actor.verified_by, actor.authenticated) == (TEST_USER_ID, LAKEFS, True)
    assert "GET /api/v1/user" in actor.detail and "test-secret-key" not in actor.detail
    launched = resolve_actor(lakefs, launcher=ALICE)
    assert (launched.user, launched.store_user) == ("alice@example.com", TEST_USER_ID)
    assert "written with lakeFS user model-factory-tester's key" in launched.describe()


def test_the_lakefs_audit_trail_names_the_lakefs_user_and_keeps_by_as_a_note(lakefs):
    _register(lakefs)
    actor = resolve_actor(lakefs)
    entry = move_alias(lakefs, "toy", "promote", actor, version=1, note="bob")
    comment = add_comment(lakefs, "toy", 1, "ready", actor, note="for the release board")
    (stored,) = read_alias(lakefs, "toy")["history"]
    assert stored["by"] == entry["by"] == TEST_USER_ID and stored["actor"]["verified_by"] == LAKEFS
    assert stored["note"] == "bob"
    assert describe_entry(stored) == f'{TEST_USER_ID} (lakeFS user, authenticated by lakeFS), note "bob"'
    assert [c["author"] for c in list_comments(lakefs, "toy", 1)] == [TEST_USER_ID]
    merged = lakefs.log(comment["commit_id"], limit=2)[1].metadata
    assert (merged["author"], merged["author_verified_by"], merged["author_authenticated"]) == (
        TEST_USER_ID, LAKEFS, "true")


def test_a_typed_name_is_never_taken_as_the_identity(tmp_path):
    from tests.cli.records import store_with_versions

    store = store_with_versions(tmp_path)
    with pytest.raises(TypeError, match="a typed name belongs in note"):
        move_alias(store, "toy", "promote", "alice", version=1)
    with pytest.raises(TypeError, match="verified core.identity.Actor"):
        add_comment(store, "toy", 1, "text", "alice")
    assert read_alias(store, "toy")["version"] is None and list_comments(store, "toy") == []


def test_entries_from_before_verified_identities_say_they_were_self_declared():
    old = {"action": "promote", "from": None, "to": 1, "by": "bob", "at": "t"}
    assert describe_entry(old) == "bob (self-declared: recorded before identities were verified)"
    new = {"action": "promote", **audit_fields(os_actor(), None)}
    assert describe_entry(new) == f"{getpass.getuser()} (OS user, not authenticated)"
