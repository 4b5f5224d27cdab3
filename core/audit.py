"""The housekeeping part of the audit trail: every applied plan that deleted or skipped something
is recorded under ``platform/housekeeping/`` on ``main``, with the verified identity of whoever
applied it (core/identity.py), what went and why.

Comments and alias moves are recorded by core/registry.py the same way. An apply that deleted
nothing changed nothing, so it leaves no record (the daily schedule would otherwise commit daily).
"""

from __future__ import annotations

import json
import re
import uuid

from core.housekeeping import AppliedPlan, HousekeepingError, HousekeepingPlan, PlannedDeletion, apply_plan
from core.identity import Actor, audit_fields
from core.registry import audit_metadata, publish_files, utc_now
from resources.artifacts.base import ArtifactStore
from resources.store.base import MAIN, VersionedStore

HOUSEKEEPING_LOG = "platform/housekeeping/"


def apply_and_record(plan: HousekeepingPlan, store: VersionedStore, artifacts: ArtifactStore, actor: Actor,
                     note: str | None = None, run_id: str | None = None) -> tuple[AppliedPlan, dict | None]:
    """Apply ``plan`` and record what it deleted; a deletion that fails part-way is recorded with
    what already went, then its HousekeepingError is raised again."""
    who = audit_fields(actor, note)  # an unverified caller is refused before anything is deleted
    try:
        applied = apply_plan(plan, store, artifacts)
    except HousekeepingError as exc:
        record_housekeeping(store, plan, AppliedPlan(deleted=exc.deleted), who, run_id, error=str(exc))
        raise
    record = record_housekeeping(store, plan, applied, who, run_id) if applied.deleted or applied.skipped else None
    return applied, record


def _item(item: PlannedDeletion) -> dict:
    return {"kind": item.kind, "target": item.target, "reason": item.reason}


def record_housekeeping(store: VersionedStore, plan: HousekeepingPlan, applied: AppliedPlan, who: dict,
                        run_id: str | None, error: str | None = None) -> dict:
    at = utc_now()
    record_id = uuid.uuid4().hex[:12]
    record = {
        "kind": "housekeeping-apply", "at": at, "id": record_id, **who, "dagster_run_id": run_id,
        "older_than_days": plan.older_than_days,
        "deleted": [_item(d) for d in applied.deleted],
        "skipped": [{**_item(d), "why": why} for d, why in applied.skipped],
        "error": error,
    }
    path = HOUSEKEEPING_LOG + f"{re.sub(r'[^0-9T]', '', at)[:15]}-{record_id}.json"
    meta = {"kind": "housekeeping-apply", "deleted": str(len(applied.deleted)), "at": at, **audit_metadata(who)}
    if run_id:
        meta["dagster_run_id"] = run_id
    head = publish_files(store, {path: json.dumps(record, indent=2, sort_keys=True).encode()},
                         f"Housekeeping: deleted {len(applied.deleted)} item(s)", meta, "housekeeping-record")
    return {**record, "path": path, "commit_id": head}


def list_housekeeping(store: VersionedStore) -> list[dict]:
    """Recorded housekeeping applies, oldest first."""
    objects = store.list_objects(MAIN, prefix=HOUSEKEEPING_LOG)
    records = [json.loads(store.get_object(MAIN, o.path)) for o in objects if o.path.endswith(".json")]
    return sorted(records, key=lambda r: (r["at"], r["id"]))
