"""Write, audit, publish: every run writes to its own store branch, created from ``main``."""

from __future__ import annotations

import json

import dagster as dg

from core.code_version import code_version
from core.identity import NOT_VERIFIED, Actor, launcher_from_tags
from resources.store.base import MAIN, Commit, VersionedStore

# Store and launcher hiccups are retried; data and quality failures raise Failure(allow_retries=False).
TRANSIENT_RETRY = dg.RetryPolicy(max_retries=2, delay=1, backoff=dg.Backoff.EXPONENTIAL)

# lakeFS shows commit metadata keys of this form as a link in its UI.
LAKEFS_UI_LINK_KEY = "::lakefs::Dagster::url[url:ui]"


def run_branch_name(run_id: str) -> str:
    return f"run-{run_id}"


def root_run_id(context: dg.AssetExecutionContext) -> str:
    """The first run of a retry chain: retries of a run share its checkpoints and so resume."""
    return context.run.tags.get("dagster/root_run_id") or context.run_id


def ensure_run_branch(store: VersionedStore, run_id: str) -> str:
    store.ensure_repository()
    name = run_branch_name(run_id)
    store.create_branch(name, MAIN, exist_ok=True)
    return name


def commit_metadata(context: dg.AssetExecutionContext, run_url: str, **extra: object) -> dict[str, str]:
    """String metadata carried by every commit the platform makes."""
    code = code_version()
    meta = {
        "dagster_run_id": context.run_id,
        LAKEFS_UI_LINK_KEY: run_url,
        "asset_key": context.asset_key.to_user_string(),
        "git_sha": str(code["git_sha"]),
        "git_dirty": str(code["dirty"]),
    }
    # Who launched the run, where the run coordinator verified it (a UI user behind the auth proxy);
    # lakeFS records the committer (the key's user) on the commit itself.
    launcher = launcher_actor(context)
    meta["launched_by_verified"] = launcher.verified_by if launcher else NOT_VERIFIED
    if launcher:
        meta["launched_by"] = launcher.user
    for k, v in extra.items():
        meta[k] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return meta


def commit_or_head(store: VersionedStore, branch: str, message: str, metadata: dict[str, str]) -> str:
    """Commit staged changes; when there are none (same data again), the head already holds them."""
    if store.has_uncommitted_changes(branch):
        commit: Commit = store.commit(branch, message, metadata)
        return commit.id
    return store.resolve_ref(branch)


def launcher_actor(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> Actor | None:
    """The verified UI user who launched this run, or None (a schedule, a sensor, the CLI, or an
    instance whose run coordinator does not verify launches: pipelines/run_coordinator.py)."""
    coordinator = context.instance.run_coordinator
    return launcher_from_tags(context.run.tags,
                              coordinator_verifies=bool(getattr(coordinator, "verifies_launch_identity", False)))
