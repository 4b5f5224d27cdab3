"""``log``: a branch's commit log in the versioned store (local directory or lakeFS), newest first.

What a user reads to see what reached ``main``: every commit with its date, message, the tags on it
(model versions ``<model>-v<N>``, dataset versions ``<dataset>-d<N>``) and the Dagster run that
made it. A run whose checks or gate failed leaves its commits on its own run branch, so they are
not in main's log. ``--first-parent`` follows only each merge's first parent: the commits the
branch's head has been, one per publish."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

from pipelines.cli.errors import UsageError
from resources.store.base import Commit, RefNotFoundError, VersionedStore

RUN_ID_KEY = "dagster_run_id"  # ops/runs.py commit_metadata


def log_command(args: argparse.Namespace) -> int:
    from pipelines.profiles import Profile  # deferred: it imports dagster

    if args.n < 1:
        raise UsageError(f"-n must be at least 1, got {args.n}")
    store = Profile.from_environment().store()
    commits, more = branch_log(store, args.branch, args.n, first_parent=args.first_parent)
    tags = tags_by_commit(store)
    if args.json:
        print(json.dumps({"ref": args.branch, "first_parent": args.first_parent, "more": more,
                          "commits": [commit_json(c, tags.get(c.id, [])) for c in commits]}, indent=2, sort_keys=True))
        return 0
    print(format_log(args.branch, commits, tags, more, first_parent=args.first_parent))
    return 0


def branch_log(store: VersionedStore, ref: str, limit: int, *, first_parent: bool = False) -> tuple[list[Commit], bool]:
    """(the newest ``limit`` commits of ``ref``, whether older ones follow); one-line errors that
    name the branches there are."""
    try:
        store.resolve_ref(ref)
    except RefNotFoundError as exc:
        try:
            branches = sorted(store.list_branches())
        except RefNotFoundError:
            raise UsageError(f"the store ({describe(store)}) has no repository yet, so no commits: run a pipeline "
                             "(make demo) first") from exc
        raise UsageError(f"{ref!r} is not a branch, tag or commit of the store ({describe(store)}); its branches: "
                         f"{', '.join(branches)}") from exc
    if not first_parent:
        commits = store.log(ref, limit=limit + 1)  # one more than shown: whether older commits follow
        return commits[:limit], len(commits) > limit
    commits = [store.get_commit(ref)]
    while len(commits) <= limit and commits[-1].parents:
        commits.append(store.get_commit(commits[-1].parents[0]))
    return commits[:limit], len(commits) > limit


def tags_by_commit(store: VersionedStore) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for tag, commit_id in store.list_tags().items():
        out.setdefault(commit_id, []).append(tag)
    return {c: sorted(t) for c, t in out.items()}


def describe(store: VersionedStore) -> str:
    return ", ".join(f"{k} {v}" for k, v in store.describe().items())


def commit_date(commit: Commit) -> str:
    return datetime.fromtimestamp(commit.creation_date, tz=timezone.utc).isoformat(timespec="seconds")


def commit_json(commit: Commit, tags: list[str]) -> dict:
    return {"id": commit.id, "date": commit_date(commit), "message": commit.message, "parents": list(commit.parents),
            "tags": tags, "metadata": dict(commit.metadata)}


def format_log(ref: str, commits: list[Commit], tags: dict[str, list[str]], more: bool, *,
               first_parent: bool = False) -> str:
    from pipelines.cli.render import table

    which = "first-parent history" if first_parent else "log"
    rows = [[c.id[:12], commit_date(c), (c.message.splitlines() or [""])[0] + (" (merge)" if len(c.parents) > 1 else ""),
             ", ".join(tags.get(c.id, [])), c.metadata.get(RUN_ID_KEY, "")[:8]] for c in commits]
    lines = [f"{ref}: {which}, newest first ({len(commits)} commit{'s' if len(commits) != 1 else ''}"
             + ("; older ones with a larger -n)" if more else ")")]
    lines += table(["commit", "date (UTC)", "message", "tags", "run"], rows, indent="")
    return "\n".join(lines)
