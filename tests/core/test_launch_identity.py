"""Launches over HTTP through a real Dagster webserver app to the platform's run coordinator: the
proxy's header becomes the run's verified launcher, a client's own launch tags never survive, and a
launch without the header (around the proxy) or with one where no proxy is configured is refused."""

from __future__ import annotations

import contextlib

import dagster as dg
import pytest
from dagster._core.run_coordinator import SubmitRunContext

from core.identity import (
    AUTH_PROXY,
    LAUNCH_RUN_TAG,
    LAUNCH_VERIFIED_TAG,
    LAUNCHED_BY_TAG,
    NOT_VERIFIED,
    PARENT_RUN_TAG,
    launcher_from_tags,
)
from tests.core.launch_webserver import running_webserver

FORGED = {LAUNCHED_BY_TAG: "mallory@example.com", LAUNCH_VERIFIED_TAG: AUTH_PROXY, LAUNCH_RUN_TAG: "old-run"}


@pytest.fixture(scope="module")
def webserver():
    with running_webserver(trust=True) as server:
        yield server


@contextlib.contextmanager
def without_proxy(webserver):
    """The same webserver as if deployed with no proxy in front (trust_identity_header: false)."""
    coordinator = webserver.instance.run_coordinator
    coordinator.configure_identity(coordinator.identity_header, trust=False)
    try:
        yield
    finally:
        coordinator.configure_identity(coordinator.identity_header, trust=True)


def run_tags(result: dict) -> dict[str, str]:
    assert result["__typename"] == "LaunchRunSuccess", result
    return {t["key"]: t["value"] for t in result["run"]["tags"]}


def test_the_proxys_header_becomes_the_runs_launcher_and_typed_tags_are_overwritten(webserver):
    result = webserver.launch(headers={"X-Forwarded-Email": "alice@example.com"}, tags=FORGED)
    tags = run_tags(result)
    run_id = result["run"]["runId"]
    assert (tags[LAUNCHED_BY_TAG], tags[LAUNCH_VERIFIED_TAG], tags[LAUNCH_RUN_TAG]) == (
        "alice@example.com", AUTH_PROXY, run_id)
    stored = webserver.instance.get_run_by_id(run_id)
    assert stored.status == dg.DagsterRunStatus.QUEUED
    actor = launcher_from_tags(stored.tags, coordinator_verifies=webserver.instance.run_coordinator.verifies_launch_identity)
    assert actor.user == "alice@example.com"


def test_a_launch_that_went_around_the_proxy_is_refused_and_its_run_fails(webserver):
    result = webserver.launch(tags=FORGED)
    assert result["__typename"] == "PythonError"
    assert "carries no X-Forwarded-Email header, so it did not come through the authenticating proxy" in result["message"]
    refused = [r for r in webserver.instance.get_runs() if r.tags.get(LAUNCHED_BY_TAG) == "mallory@example.com"]
    assert refused and all(r.status == dg.DagsterRunStatus.FAILURE for r in refused)


def test_without_a_proxy_a_header_is_refused_and_plain_launches_are_not_verified(webserver):
    with without_proxy(webserver):
        forged = webserver.launch(headers={"X-Forwarded-Email": "alice@example.com"})
        plain = run_tags(webserver.launch(tags=FORGED))
    assert forged["__typename"] == "PythonError" and "not configured behind the authenticating proxy" in forged["message"]
    assert plain[LAUNCH_VERIFIED_TAG] == NOT_VERIFIED and plain[LAUNCHED_BY_TAG] != "mallory@example.com"


def test_daemon_submissions_verify_nobody_but_a_retry_keeps_its_parents_launcher(webserver):
    parent_id = webserver.launch(headers={"X-Forwarded-Email": "alice@example.com"})["run"]["runId"]
    parent = webserver.instance.get_run_by_id(parent_id)
    coordinator = webserver.instance.run_coordinator
    retry = dg.DagsterRun(job_name=parent.job_name, run_id="retry-1", tags={**parent.tags, PARENT_RUN_TAG: parent_id})
    copied = dg.DagsterRun(job_name=parent.job_name, run_id="backfill-1", tags=dict(parent.tags))  # no parent run
    # The daemon submits with a request context that carries no HTTP request.
    workspace = webserver.process_context.create_request_context()
    assert coordinator.identity_tags(SubmitRunContext(retry, workspace)) == {
        k: parent.tags[k] for k in (LAUNCHED_BY_TAG, LAUNCH_VERIFIED_TAG, LAUNCH_RUN_TAG)}
    assert coordinator.identity_tags(SubmitRunContext(copied, workspace))[LAUNCH_VERIFIED_TAG] == NOT_VERIFIED
