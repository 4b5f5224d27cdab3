"""The commands that look after the platform as a whole: ``housekeeping``, ``workspace`` and ``scaffold``."""

from __future__ import annotations

import argparse

from core.audit import apply_and_record, list_housekeeping
from core.housekeeping import format_plan, plan_housekeeping, reproductions_root
from core.identity import describe_entry, resolve_actor
from pipelines.cli.errors import UsageError
from pipelines.cli.instance import dagster_instance
from pipelines.profiles import REPO_ROOT, Profile


def housekeeping_command(args: argparse.Namespace) -> int:
    """List (and with --apply delete) what store housekeeping would remove, with the reasons."""
    from ops.housekeeping import in_use_from_instance  # imports dagster: only this command needs it

    profile = Profile.from_environment()
    resources = profile.resources()
    store, artifacts, settings = resources["store"].get(), resources["artifacts"].get(), resources["platform"]
    if args.history:
        print(format_housekeeping_history(list_housekeeping(store)))
        return 0
    with dagster_instance() as instance:
        in_use = in_use_from_instance(instance)
    plan = plan_housekeeping(store, artifacts, settings.checkpoints_root, reproductions_root(settings.root),
                             older_than_days=args.older_than_days, in_use=in_use)
    print(format_plan(plan))
    if not args.apply:
        print("Dry run: nothing was deleted. Add --apply to delete the items marked 'delete'.")
        return 0
    applied, record = apply_and_record(plan, store, artifacts, resolve_actor(store), note=args.note)
    for item, why in applied.skipped:
        print(f"skipped {item.kind} {item.target}: {why}")
    print(f"Deleted {len(applied.deleted)} item(s); skipped {len(applied.skipped)}.")
    if record:
        print(f"Recorded in the audit trail as applied by {describe_entry(record)} ({record['path']}).")
    return 0


def format_housekeeping_history(records: list[dict]) -> str:
    if not records:
        return "No housekeeping apply is recorded (only applies that deleted or skipped something are)."
    lines = []
    for r in records:
        lines.append(f"{r['at']}  deleted {len(r['deleted'])}, skipped {len(r['skipped'])}"
                     f"{' (failed: ' + r['error'] + ')' if r.get('error') else ''}  by {describe_entry(r)}")
        lines.extend(f"    {d['kind']} {d['target']}: {d['reason']}" for d in r["deleted"])
    return "\n".join(lines)


def workspace_command(args: argparse.Namespace) -> int:
    """Load every code location of the workspace and check names across them."""
    from pipelines.cli.lookup import workspace_of
    from pipelines.workspace import check_workspace

    listings = check_workspace(workspace_of(args))  # ./workspace.yaml first, as train, versions and the rest
    for location, pipelines in listings.items():
        names = ", ".join(p["name"] + (f" (reads {p['dataset']}" + (f" from {p['dataset_location']})"
                                                                    if p.get("dataset_location") else ")")
                                       if p["dataset"] else "") for p in pipelines)
        print(f"{location}: {names or 'no pipelines'}")
    print(f"{len(listings)} code location(s): pipeline and dataset names are unique, every shared dataset is "
          "published where its readers look for it.")
    return 0


def scaffold_command(args: argparse.Namespace) -> int:
    """Write a new YAML building block from its template."""
    from pipelines.components.scaffold import scaffold_block

    try:
        path = scaffold_block(args.kind, args.name, args.defs_dir)
    except (FileExistsError, NotADirectoryError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"Wrote {path}: fill in the fields marked REQUIRED; the block loads with the code location.")
    return 0


DEFAULT_DEFS_DIR = REPO_ROOT / "pipelines" / "defs"
