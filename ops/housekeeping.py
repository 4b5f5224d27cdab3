"""Store housekeeping as a Dagster job: plan (core/housekeeping.py), log every item with its
reason, delete unless it is a dry run.

The Dagster instance supplies what the plan cannot see in the store: runs still in flight (their
branches and checkpoints stay) and the commits the latest asset materializations point at.
"""

import dagster as dg
from pydantic import Field

from core.audit import apply_and_record
from core.housekeeping import (
    InUse,
    format_plan,
    plan_housekeeping,
    reproductions_root,
)
from core.identity import resolve_actor
from ops.runs import launcher_actor
from resources.platform import ArtifactStoreResource, PlatformSettings, VersionedStoreResource

FINISHED_STATUSES = frozenset({dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
                               dg.DagsterRunStatus.CANCELED})
# A retry trains in its root run's checkpoint dir, so an in-flight retry keeps those runs' things too.
RELATED_RUN_TAGS = ("dagster/root_run_id", "dagster/parent_run_id")
DATA_VERSION_TAG = "dagster/data_version"
DEFAULT_OLDER_THAN_DAYS = 7.0
PLAN_METADATA_LINES = 200


def in_flight_run_ids(instance: dg.DagsterInstance) -> frozenset[str]:
    """Runs not finished (every status but success, failure, canceled: new statuses count as in
    flight), with the runs they resume from."""
    statuses = [s for s in dg.DagsterRunStatus if s not in FINISHED_STATUSES]
    ids: set[str] = set()
    for run in instance.get_runs(dg.RunsFilter(statuses=statuses)):
        ids.add(run.run_id)
        ids.update(run.tags[t] for t in RELATED_RUN_TAGS if run.tags.get(t))
    return frozenset(ids)


def materialized_commits(instance: dg.DagsterInstance) -> frozenset[str]:
    """Data versions of every asset's latest materialization: the platform's assets use the store
    commit they wrote as their data version, and downstream runs read that commit."""
    events = instance.get_latest_materialization_events(instance.get_asset_keys())
    return frozenset(
        entry.asset_materialization.tags[DATA_VERSION_TAG]
        for entry in events.values()
        if entry is not None and entry.asset_materialization is not None
        and entry.asset_materialization.tags and entry.asset_materialization.tags.get(DATA_VERSION_TAG)
    )


def in_use_from_instance(instance: dg.DagsterInstance) -> InUse:
    return InUse(run_ids=in_flight_run_ids(instance), commits=materialized_commits(instance))


class HousekeepingConfig(dg.Config):
    older_than_days: float = Field(default=DEFAULT_OLDER_THAN_DAYS, gt=0,
                                   description="Delete unregistered runs' branches and checkpoints, and "
                                               "reproductions, untouched for longer than this.")
    dry_run: bool = Field(default=True, description="Only log what would be deleted (the schedule sets false).")


@dg.op(description="Plan store housekeeping, log each item with its reason, and delete unless dry_run. Never "
                   "deletes what a registered version's lineage points at, nor what an in-flight run uses.",
       out=dg.Out(dict))
def clean_store(context: dg.OpExecutionContext, config: HousekeepingConfig, store: VersionedStoreResource,
                artifacts: ArtifactStoreResource, platform: PlatformSettings) -> dg.Output:
    s, a = store.get(), artifacts.get()
    plan = plan_housekeeping(s, a, platform.checkpoints_root, reproductions_root(platform.root),
                             older_than_days=config.older_than_days, in_use=in_use_from_instance(context.instance))
    verb = "would delete" if config.dry_run else "deleting"
    for item in plan.deletions:
        context.log.info(f"{verb} {item.kind} {item.target}: {item.reason}")
    for item in plan.kept:
        context.log.info(f"keeping {item.kind} {item.target}: {item.reason}")
    applied = record = None
    if not config.dry_run:
        # Who applies it: the UI user the auth proxy verified, else the store's lakeFS user, else
        # the OS user (marked as not authenticated); recorded under platform/housekeeping/ on main.
        actor = resolve_actor(s, launcher_actor(context))
        applied, record = apply_and_record(plan, s, a, actor, run_id=context.run_id)
        context.log.info(f"applied by {actor.describe()}"
                         + (f"; recorded in {record['path']} (store commit {record['commit_id'][:12]})" if record else ""))
    for item, why in applied.skipped if applied else ():
        context.log.warning(f"skipped {item.kind} {item.target}: {why}")
    summary = {
        "dry_run": config.dry_run,
        "planned": plan.counts(),
        "kept": len(plan.kept),
        "deleted": len(applied.deleted) if applied else 0,
        "skipped": len(applied.skipped) if applied else 0,
    }
    return dg.Output(summary, metadata={
        "dry_run": config.dry_run,
        "older_than_days": config.older_than_days,
        **{f"planned_{kind.replace('-', '_')}": n for kind, n in plan.counts().items()},
        "kept": summary["kept"],
        "deleted": summary["deleted"],
        "skipped": summary["skipped"],
        "plan": dg.MetadataValue.md(plan_markdown(format_plan(plan))),
        **({"applied_by": record["by"], "applied_by_verified_by": record["actor"]["verified_by"],
            "audit_record": record["path"]} if record else {}),
    })


def plan_markdown(text: str) -> str:
    lines = text.splitlines()
    if len(lines) > PLAN_METADATA_LINES:
        # The summary line stays; every item is also in the run's logs.
        omitted = len(lines) - PLAN_METADATA_LINES
        lines = [*lines[:PLAN_METADATA_LINES - 1], f"... {omitted} more item(s) in the run's logs", lines[-1]]
    return "```\n" + "\n".join(lines) + "\n```"


@dg.job(description="Store housekeeping: delete merged or old run branches, unregistered runs' checkpoints and "
                    "old reproductions; a dry run by default when launched by hand.")
def store_housekeeping():
    clean_store()


housekeeping_schedule = dg.ScheduleDefinition(
    name="store_housekeeping_daily", job=store_housekeeping, cron_schedule="0 3 * * *",
    run_config={"ops": {"clean_store": {"config": {"dry_run": False}}}},
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=(
        "Daily store housekeeping (applies, not a dry run). Stopped by default: it deletes failed runs' "
        f"branches and checkpoints after {DEFAULT_OLDER_THAN_DAYS:g} days, after which such a run can no longer "
        "be re-executed from its checkpoints and its evidence is gone; with lakeFS, deleting a branch also lets "
        "garbage collection drop objects only that branch held. Start it once that retention is agreed; "
        "launch store_housekeeping by hand (dry run by default) to see what it would delete."),
)


def housekeeping_definitions() -> dg.Definitions:
    return dg.Definitions(jobs=[store_housekeeping], schedules=[housekeeping_schedule])
