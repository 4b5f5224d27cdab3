"""Store housekeeping: delete run branches past a configurable age.

Failed runs leave their branch for inspection; after ``older_than_hours`` it goes, unless a
model version's lineage points at a commit on it.
"""


import time

import dagster as dg
from pydantic import Field

from core.lineage import commit_ids
from core.registry import list_models, list_versions, read_lineage
from resources.platform import VersionedStoreResource
from resources.store.base import VersionedStore

RUN_BRANCH_PREFIX = "run-"


def lineage_commits(store: VersionedStore) -> set[str]:
    """Every commit any registered model version's lineage record points at."""
    out: set[str] = set()
    for model in list_models(store):
        for version in list_versions(store, model):
            out.update(commit_ids(read_lineage(store, model, version)).values())
    return out


def stale_run_branches(store: VersionedStore, older_than_s: float, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    protected = lineage_commits(store)
    stale = []
    for name, head in sorted(store.list_branches().items()):
        if not name.startswith(RUN_BRANCH_PREFIX):
            continue
        if now - store.get_commit(head).creation_date < older_than_s:
            continue
        if any(c.id in protected for c in store.log(name, limit=200)[:_commits_ahead_of_main(store, name)]):
            continue
        stale.append(name)
    return stale


def _commits_ahead_of_main(store: VersionedStore, branch: str) -> int:
    """How many of the branch's newest commits are not on main (only those belong to the run)."""
    on_main = {c.id for c in store.log("main", limit=10_000)}
    for i, c in enumerate(store.log(branch, limit=200)):
        if c.id in on_main:
            return i
    return 200


class CleanupConfig(dg.Config):
    older_than_hours: float = Field(default=72.0, description="Delete run branches whose head is older than this.")
    dry_run: bool = Field(default=False, description="Only report what would be deleted.")


@dg.op(description="Delete run branches older than the configured age, never one a lineage record points to.")
def cleanup_run_branches(context: dg.OpExecutionContext, config: CleanupConfig, store: VersionedStoreResource) -> list[str]:
    s = store.get()
    stale = stale_run_branches(s, config.older_than_hours * 3600)
    for name in stale:
        if not config.dry_run:
            s.delete_branch(name)
        context.log.info(f"{'would delete' if config.dry_run else 'deleted'} run branch {name}")
    context.add_output_metadata({"deleted": len(stale), "dry_run": config.dry_run})
    return stale


@dg.job(description="Store housekeeping: remove old run branches.")
def store_housekeeping():
    cleanup_run_branches()


housekeeping_schedule = dg.ScheduleDefinition(job=store_housekeeping, cron_schedule="0 3 * * *",
                                              default_status=dg.DefaultScheduleStatus.RUNNING)
