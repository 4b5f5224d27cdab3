"""The raw_dataset and shards outputs of a run that reuses a published dataset version.

When the data key of a run's sources (assets/data_key.py) equals the newest published version's,
neither asset makes anything: raw_dataset names the version's raw commit and shards its shards
commit, each with the validation report committed there, and training reads that commit. The
lineage then names the version beside the very commit its tag points at (core/datasets.py).

Both assets say so: a log line starting "reusing", the materialization metadata
``reused_dataset_version`` (the tag) and a check result that names the report it stands on.
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import dagster as dg

from core.datasets import Reuse, validation_report_path
from core.published_datasets import published_inputs, validation_summary

REUSED = "reused"  # the raw value's field the shards asset reads


def not_reused_line(dataset: str, reuse: Reuse, key: dict) -> str:
    """Why a run makes new data (the log line beside the ingest)."""
    if reuse.newest is None:
        return f"{dataset}: no published version yet; ingesting and sharding (data key {key['sha256'][:12]})"
    changed = list(reuse.changed)
    parts = " and ".join([", ".join(changed[:-1]), changed[-1]] if len(changed) > 1 else changed)
    return (f"{dataset}: the {parts} differ from {reuse.newest}'s; ingesting and sharding "
            f"a new version (data key {key['sha256'][:12]})")


def reused_raw(context, store, asset_key: dg.AssetKey, check: str, dataset: str, reuse: Reuse, raw_path: str,
               branch: str, source_commit: str | None):
    """raw_dataset's output and check for a reused version: its raw commit, nothing ingested."""
    raw_commit = reuse.manifest.get("source_commit") or reuse.commit_id
    rows = store.get_commit(raw_commit).metadata.get("rows")
    key = reuse.manifest["data_key"]
    value = {"dataset": dataset, "commit_id": raw_commit, "path": raw_path, "rows": int(rows) if rows else None,
             "branch": branch, "source_commit": source_commit,
             "checks": validation_summary(store, raw_commit, dataset, "raw_dataset"), "data_key": key,
             REUSED: {"dataset_version": reuse.tag, "shards_commit": reuse.commit_id}}
    context.log.info(f"{dataset}: reusing {reuse.tag}: its raw content and preprocessing equal this run's (data key "
                     f"{key['sha256'][:12]}); raw commit {raw_commit[:12]} and shards commit {reuse.commit_id[:12]} "
                     "are used as they are, nothing is ingested or sharded")
    yield dg.Output(value, data_version=dg.DataVersion(raw_commit), metadata={
        "commit_id": raw_commit, "reused_dataset_version": reuse.tag, "data_key": key["sha256"],
        **({"rows": int(rows)} if rows else {}), **({"source_commit": source_commit} if source_commit else {})})
    yield _reused_check(asset_key, check, dataset, "raw_dataset", raw_commit, reuse.tag)


def reused_shards(context, store, asset_key: dg.AssetKey, check: str, dataset: str, reused: dict):
    """shards' output and check for a reused version: the value a published version reads back as."""
    tag, commit_id = reused["dataset_version"], reused["shards_commit"]
    value, _ = published_inputs(store, dataset, commit_id, tag)
    value[REUSED] = True
    context.log.info(f"{dataset}: reusing {tag}'s shards at commit {commit_id[:12]}; nothing is sharded")
    yield dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
        "commit_id": commit_id, "dataset_version": tag, "reused_dataset_version": tag,
        **{f"{k}_samples": n for k, n in value["num_samples"].items()}})
    yield _reused_check(asset_key, check, dataset, "shards", commit_id, tag)


def _reused_check(asset_key: dg.AssetKey, check: str, dataset: str, asset: str, commit_id: str,
                  tag: str) -> dg.AssetCheckResult:
    """The blocking check of a reused asset: the suite's report at the version's commit, which
    passed (``reusable_version`` reuses nothing else); not run again."""
    return dg.AssetCheckResult(
        asset_key=asset_key, check_name=check, passed=True, severity=dg.AssetCheckSeverity.ERROR,
        description=f"passed at commit {commit_id[:12]} when {tag} was made; reused, not run again",
        metadata={"commit_id": commit_id, "reused_dataset_version": tag,
                  "report": validation_report_path(dataset, asset)})
