"""The shards asset of an image folder, its parts sharded over Dagster steps.

A 2 TB folder is thousands of parts (assets/kinds/image_parts.py); one step sharding them all
would be one pod for the whole folder, and one failure would redo all of it. So the asset is a
graph (Dagster's ``graph_asset``) of three ops:

- ``plan``: the parts of the raw copy that the previous version has not sharded, in groups of
  ``source.parts_per_step``, one dynamic output each (Dagster's ``DynamicOut``);
- ``shard_parts``, mapped over them: each group is a step of its own, a pod of its own with the
  Kubernetes executor, with the transient retry policy, so a failed group is retried alone. It
  fetches its parts' raw copies, shards them, checks the files it wrote (sha256, read-back, id
  order, decodes) and stages them on the run's branch, uncommitted;
- ``publish`` (after ``collect``): the version's manifest from the groups' records and the
  previous version's kept parts, the split-level checks on all of it, and then one commit. A
  version is therefore all its parts or none: a failed step fails the run before that commit,
  and nothing reaches the branch's history or main. A re-execution of the run from the failure
  runs only the failed groups; the others' outputs (their records and where they staged their
  files) come from Dagster's IO manager, and ``publish`` copies those files onto the new run's
  branch.

Dynamic outputs rather than Dagster partitions or a backfill: the groups are known only once the
raw copy exists (they are the parts that changed), they are not a dimension users select or
schedule, and a version must be one commit: partitions would make every group its own
materialisation of the asset, each free to publish alone.

How parts are grouped and put back in order is shared with tables and text corpora
(assets/shard_steps.py). Locally (in-process executor) the steps run one after another, each on the whole worker pool,
which is what one machine can give; on Kubernetes ``k8s_job_executor`` runs each step as a pod.
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import json
import tempfile
from pathlib import Path

import dagster as dg

from assets.kinds.image_checks import check_shard_files
from assets.kinds.image_parts import INDEX_NAME, read_index
from assets.kinds.image_shards import CARRIED
from assets.kinds.image_store import put_shards, strip_carried
from assets.quality.runner import QualityReport
from assets.reuse import REUSED, reused_shards
from assets.shard_steps import assemble_parts, carry_raw_commit, step_groups
from assets.shards_output import shards_outputs, stamp_manifest
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource

CHECK = "shard_expectations"


def assemble(parts: list[dict], made: list[dict], previous: dict | None) -> tuple[dict, list[str], dict[str, str]]:
    """(the version's manifest, the groups' file failures, staged path -> branch) from the raw
    copy's ``parts`` in order, the groups' results ``made`` and the ``previous`` manifest. Every
    shard entry is marked ``CARRIED``: the groups checked their files, the previous version its own."""
    kept_entries = {e["path"]: e for info in (previous or {}).get("splits", {}).values() for e in info["shards"]}
    kept = {r["key"]: (r, {s: [kept_entries[p] for p in r["splits"][s]["shards"]] for s in r["splits"]})
            for r in (previous or {}).get("parts", [])}
    ordered, failures, staged = assemble_parts([p["key"] for p in parts], made, kept, [p["name"] for p in parts])
    header = dict(made[0]["header"]) if made else {k: v for k, v in (previous or {}).items()
                                                  if k not in ("splits", "parts")}
    splits = {s: {"num_samples": 0, "shards": []} for s in ("train", "validation", "test")}
    for record, entries in ordered:
        for s in splits:
            splits[s]["shards"] += [{**e, CARRIED: True} for e in entries[s]]
            splits[s]["num_samples"] += record["splits"][s]["num_samples"]
    return {**header, "splits": splits, "parts": [r for r, _ in ordered]}, failures, staged


def build_image_shards_asset(spec: PipelineSpec, kind, keys: dict[str, dg.AssetKey], checked) -> dg.AssetsDefinition:
    name = spec.name
    prefix = f"datasets/{name}/"
    shard_prefix = prefix + "shards/"
    key = keys["shards"]
    check_spec = dg.AssetCheckSpec(CHECK, asset=key, blocking=True,
                                   description="Counts, split fractions, labels and checksums of the shards.")

    @dg.op(name=f"{key.to_python_identifier()}_plan", out=dg.DynamicOut(), retry_policy=TRANSIENT_RETRY)
    def plan(context, raw: dict, store: VersionedStoreResource):
        if raw.get(REUSED):
            return
        s = store.get()
        parts = read_index(s.get_object(raw["commit_id"], prefix + "raw/" + INDEX_NAME))["parts"]
        previous = _previous_manifest(s, raw, shard_prefix)
        groups = step_groups(parts, {p["key"] for p in (previous or {}).get("parts", [])}, spec.source.parts_per_step)
        context.log.info(f"{name}: {sum(map(len, groups))} of {len(parts)} part(s) to shard, in {len(groups)} step(s) "
                         f"of up to {spec.source.parts_per_step}")
        for i, group in enumerate(groups):
            yield dg.DynamicOutput({"raw_commit": raw["commit_id"], "parts": group}, mapping_key=f"parts_{i:05d}")

    @dg.op(name=f"{key.to_python_identifier()}_shard_parts", retry_policy=TRANSIENT_RETRY)
    def shard_parts(context, group: dict, store: VersionedStoreResource) -> dict:
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        with tempfile.TemporaryDirectory(prefix="shard-parts-") as tmp:
            raw_dir, out = Path(tmp) / "raw", Path(tmp) / "shards"
            raw_dir.mkdir()
            (raw_dir / INDEX_NAME).write_text(json.dumps({**_index_of(group["parts"])}))
            for part in group["parts"]:
                s.download(group["raw_commit"], prefix + "raw/" + part["raw"], raw_dir / part["raw"])
            try:
                fragment = kind.shard(spec, raw_dir, out)
            except ValueError as exc:
                raise dg.Failure(description=f"pipeline {name!r}: cannot shard the raw data: {exc}",
                                 allow_retries=False) from exc
            failures = check_shard_files(spec, fragment, out)
            for info in fragment["splits"].values():  # staged, not committed: publish commits the version
                for entry in info["shards"]:
                    s.put_file(branch, shard_prefix + entry["path"], out / entry["path"])
        names = ", ".join(p["name"] for p in group["parts"][:3]) + (" ..." if len(group["parts"]) > 3 else "")
        context.log.info(f"{name}: {len(group['parts'])} part(s) sharded ({names}): "
                         f"{sum(len(i['shards']) for i in fragment['splits'].values())} shard file(s) staged on {branch}"
                         + (f"; {len(failures)} file problem(s)" if failures else ""))
        by_path = {e["path"]: e for info in fragment["splits"].values() for e in info["shards"]}
        return {"branch": branch, "prefix": shard_prefix, "failures": failures, "records": fragment["parts"],
                "slots": [r["key"] for r in fragment["parts"]],
                "entries": [{s_: [by_path[p] for p in r["splits"][s_]["shards"]] for s_ in r["splits"]}
                            for r in fragment["parts"]],
                "header": {k: v for k, v in fragment.items() if k not in ("splits", "parts")}}

    @dg.op(name=f"{key.to_python_identifier()}_publish", retry_policy=TRANSIENT_RETRY,
           out={"result": dg.Out(), check_spec.get_python_identifier(): dg.Out(is_required=False)})
    def publish(context, raw: dict, made: list, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        if raw.get(REUSED):
            yield from reused_shards(context, s, key, CHECK, name, raw[REUSED])
            return
        branch = ensure_run_branch(s, context.run_id)
        parts = read_index(s.get_object(raw["commit_id"], prefix + "raw/" + INDEX_NAME))["parts"]
        previous = _previous_manifest(s, raw, shard_prefix)
        manifest, failures, staged = assemble(parts, made, previous)
        stamp_manifest(spec, manifest, raw)
        with tempfile.TemporaryDirectory(prefix="shards-") as tmp:
            checked_report = kind.check_shards(spec, manifest, Path(tmp))  # split-level, on the parts' records
            report = QualityReport(checked_report.asset, checked_report.outcomes, failures + checked_report.failures)
            moved = put_shards(s, branch, shard_prefix, Path(tmp), manifest, raw.get("previous_commit"), staged)
            carry_raw_commit(context, s, raw, branch)
        manifest = strip_carried(manifest)
        context.log.info(f"{name}: the version's {len(manifest['parts'])} part(s): {len(made)} step(s) sharded "
                         f"{sum(len(g['records']) for g in made)}, {moved['kept']} shard file(s) on the branch "
                         f"({moved['copied']} copied from an earlier attempt or version), {moved['removed']} removed; "
                         "one commit")
        yield from shards_outputs(context, s, spec, key, raw, manifest, report, branch, platform, checked)

    @dg.graph_asset(key=key, group_name=name, ins={"raw": dg.AssetIn(keys["raw_dataset"])}, kinds={"numpy"},
                    check_specs=[check_spec],
                    description=f"{name} preprocessed into typed-column shards (format v2), split "
                                "train/validation/test; its changed parts sharded over steps.")
    def shards(raw):
        made = plan(raw).map(shard_parts).collect()
        return publish(raw, made)

    return shards


def _previous_manifest(store, raw: dict, shard_prefix: str) -> dict | None:
    commit = raw.get("previous_commit")
    return json.loads(store.get_object(commit, shard_prefix + "manifest.json")) if commit else None


def _index_of(parts: list[dict]) -> dict:
    from assets.kinds.image_parts import index

    return index(parts, salt="", target=0)
