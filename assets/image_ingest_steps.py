"""The raw_dataset asset of an image folder, its new parts ingested over Dagster steps.

Decoding and checking every image of a 2 TB folder is the longest stage of its first version;
one step doing it is one pod for the whole folder, and one failure redoes all of it. So the asset
is a graph (Dagster's ``graph_asset``) of three ops, the stages of assets/kinds/image_ingest.py:

- ``plan``: the files listed, labelled and hashed, the previous version's parts that are still
  whole kept, the other images cut into new parts, and those in groups of
  ``source.parts_per_step`` (the knob the shards graph uses: a step's share of reading is then a
  step's share of sharding), one dynamic output each (Dagster's ``DynamicOut``). A run whose data
  a published version already holds ends here (its reuse is decided before anything is decoded).
  A folder in the store's ``sources/`` area is listed and labelled from the store's listing, and
  only its files that are new or changed since the newest version are downloaded, to hash them
  (assets/source_hashes.py): the plan of a 1 % edit reads 1 % of the folder, not all of it;
- ``ingest_parts``, mapped over the groups: each is a step of its own (a pod of its own with the
  Kubernetes executor), with the transient retry policy, so a failed group is retried alone. It
  decodes and checks its images on the worker pool, writes each part's raw copy and rows table,
  stages them on the run's branch, uncommitted, and returns what the report needs of them (counts,
  the rows it rejected, its problems);
- ``publish`` (after ``collect``): ``parts.json``, the raw suite judged on every row of the
  version (the kept parts' rows tables and the new ones', never the new parts alone), then ONE
  commit with the report, the blocking ``raw_expectations`` check and the output the shards graph
  reads. A version's raw copy is therefore all its parts or none: a failed group fails the run
  before that commit. A re-execution from the failure runs only the failed groups; the others'
  results come from Dagster's IO manager and their files from the first run's branch, which
  ``put_raw`` copies onto the new run's branch.

Dynamic outputs rather than partitions or a backfill, for the reasons the shards graph gives
(assets/image_shard_steps.py): the groups exist only once the folder is listed, nobody selects or
schedules them, and the version must be one commit.
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import dataclasses
import json
import tempfile
from pathlib import Path

import dagster as dg

from assets import ingest
from assets.kinds.image_ingest import NewPart
from assets.kinds.image_listing import StoreListing
from assets.kinds.image_store import parts_line, previous_parts, put_raw, unstage
from assets.reuse import not_reused_line, reused_raw
from assets.source_hashes import record_bytes, record_path
from assets.source_place import SOURCES_PREFIX
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource

CHECK = "raw_expectations"


def ingest_groups(parts: list[NewPart], per_step: int) -> list[list[NewPart]]:
    """The new parts, ``per_step`` to a group, in id order: a step's share of the decoding."""
    return [parts[i:i + per_step] for i in range(0, len(parts), per_step)]


def build_image_raw_asset(spec: PipelineSpec, kind, keys: dict[str, dg.AssetKey], *, source_commit_tag: str,
                          checked, located_sources) -> dg.AssetsDefinition:
    """``checked``: assets.pipeline's helpers; ``located_sources``: assets.typed_data's (where the run reads)."""
    commit_checked, gate, _replace_prefix, _publish, check_owner, link = checked
    name = spec.name
    raw_prefix = ingest.dataset_prefix(name) + "raw/"
    raw_store_path = raw_prefix + kind.raw_name
    key = keys["raw_dataset"]
    ident = key.to_python_identifier()
    check_spec = dg.AssetCheckSpec(CHECK, asset=key, blocking=True,
                                   description=f"Checks on every file of the {spec.source.describe()}.")

    @dg.op(name=f"{ident}_plan", retry_policy=TRANSIENT_RETRY,
           out={"plan": dg.Out(), "groups": dg.DynamicOut()})
    def plan(context, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        s.ensure_repository()
        check_owner(s, spec)
        with tempfile.TemporaryDirectory(prefix="raw-plan-") as tmp:
            src = located_sources(context, spec, s, platform.sources_root, Path(tmp), source_commit_tag)
            source_commit, data, reuse = src.source_commit, src.key, src.reuse
            if reuse.tag is not None:  # the newest version holds this very data: nothing to decode
                yield dg.Output({"reuse": reuse, "source_commit": source_commit}, "plan")
                return
            context.log.info(not_reused_line(name, reuse, data))
            previous = previous_parts(s, reuse.newest_commit, raw_prefix, Path(tmp))
            made = kind.plan_ingest(spec, _listing(s, src), src.root, salt=data["parameters"] + data["code"],
                                    hashes=src.hashes, previous=previous)
        groups = ingest_groups(made.new, spec.source.parts_per_step)
        context.log.info(f"{name}: {len(made.kept)} part(s) kept from {reuse.newest or 'no previous version'}, "
                         f"{len(made.new)} new part(s) ({sum(p.record['images'] for p in made.new)} images) to "
                         f"ingest in {len(groups)} step(s) of up to {spec.source.parts_per_step}")
        yield dg.Output({"plan": made.without_entries(), "source_commit": source_commit, "data_key": data,
                         "source_hashes": src.record,
                         "previous_commit": reuse.newest_commit if previous else None,
                         "previous_tag": reuse.newest if previous else None}, "plan")
        for i, group in enumerate(groups):
            # a store's sources were downloaded under this step's temporary folder: each group
            # fetches its own files from the commit; a local folder's are read where they lie
            yield dg.DynamicOutput({"parts": group, "source_commit": source_commit}, mapping_key=f"parts_{i:05d}",
                                   output_name="groups")

    @dg.op(name=f"{ident}_ingest_parts", retry_policy=TRANSIENT_RETRY)
    def ingest_parts(context, group: dict, store: VersionedStoreResource) -> dict:
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        with tempfile.TemporaryDirectory(prefix="ingest-parts-") as tmp:
            parts = _fetched(s, group, Path(tmp) / "sources")
            out = Path(tmp) / "raw"
            found = kind.ingest_parts(spec, parts, out)
            staged = {}
            for part in parts:  # staged, not committed: publish commits the version
                for rel in (part.record["raw"], part.record["rows_table"]):
                    if (out / rel).is_file():
                        s.put_file(branch, raw_prefix + rel, out / rel)
                        staged[raw_prefix + rel] = branch
        names = ", ".join(p.record["name"] for p in parts[:3]) + (" ..." if len(parts) > 3 else "")
        context.log.info(f"{name}: {len(parts)} part(s) ingested ({names}): "
                         f"{sum(f['accepted'] for f in found['parts'].values())} of "
                         f"{sum(p.record['images'] for p in parts)} images accepted, {len(staged)} file(s) staged on "
                         f"{branch}" + (f"; {found['count']} problem(s)" if found["count"] else ""))
        return {**found, "staged": staged}

    @dg.op(name=f"{ident}_publish", retry_policy=TRANSIENT_RETRY,
           out={"result": dg.Out(), check_spec.get_python_identifier(): dg.Out(is_required=False)})
    def publish(context, planned: dict, made: list, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        source_commit = planned["source_commit"]
        if planned.get("reuse") is not None:
            yield from reused_raw(context, s, key, CHECK, name, planned["reuse"], raw_store_path, branch,
                                  source_commit)
            return
        staged = {path: where for group in made for path, where in group["staged"].items()}
        previous_commit = planned["previous_commit"]
        with tempfile.TemporaryDirectory(prefix="raw-") as tmp:
            fetched = Path(tmp) / "rows"

            def rows_table(record: dict):  # the suite's input: a kept part's at its commit, a new one's where staged
                path = raw_prefix + record["rows_table"]
                where = previous_commit if record["reused"] else staged.get(path)
                return None if where is None else s.download(where, path, fetched / record["rows_table"])

            raw = kind.finish_ingest(spec, planned["plan"], made, Path(tmp) / "raw", rows_table)
            if raw.report.passed:
                moved = put_raw(s, branch, raw_prefix, raw.path, previous_commit, staged)
                context.log.info(parts_line(name, raw.parts, planned["previous_tag"], moved))
            else:  # only the evidence stays on the run branch, as when one step ingests
                unstage(s, branch, staged)
            s.put_object(branch, raw_prefix + "sources.json", json.dumps(raw.sources, indent=2, sort_keys=True).encode())
            if planned.get("source_hashes"):  # the store's files: the next plan hashes only the ones that change
                s.put_object(branch, record_path(name), record_bytes(planned["source_hashes"]))
        commit_id = commit_checked(context, s, branch, platform, raw.report, "raw_dataset",
                                   f"Ingest raw data of {name}", rows=str(raw.rows), source_commit=source_commit or "")
        value = {"dataset": name, "commit_id": commit_id, "path": raw_store_path, "rows": raw.rows, "branch": branch,
                 "source_commit": source_commit, "checks": raw.report.summary(), "data_key": planned["data_key"],
                 "previous_commit": previous_commit, "parts": raw.parts}
        yield dg.Output(value, output_name="result", data_version=dg.DataVersion(commit_id), metadata={
            "commit_id": commit_id, "rows": raw.rows, "files": len(raw.sources), "store_link": link(s, commit_id),
            "parts_made": raw.parts["new"], "parts_reused": raw.parts["reused"], "ingest_steps": len(made),
            **({"source_commit": source_commit} if source_commit else {})})
        yield from gate(context, raw.report, key, CHECK, commit_id, branch)

    @dg.graph_asset(key=key, group_name=name, kinds={"parquet"}, check_specs=[check_spec],
                    description=f"Source files of {name} ({spec.source.describe()}), validated and committed to the "
                                "run branch; its new parts ingested over steps.")
    def raw_dataset():
        planned, groups = plan()
        made = groups.map(ingest_parts).collect()
        return publish(planned, made)

    return raw_dataset


def _listing(store, src) -> list[Path] | StoreListing:
    """What the plan lists: a local folder's files, or the store's listing (names and sizes as
    described), so that no image is downloaded by the plan but the new or changed ones the data
    key hashed; a manifest is downloaded when listed (once: ``ReadSources.download``)."""
    if src.source_commit is None:
        return src.read.files(store)
    return StoreListing(tuple((d["file"], d["bytes"]) for d in src.described),
                        fetch=lambda name: src.read.download(store, name))


def _fetched(store, group: dict, dest: Path) -> list[NewPart]:
    """The group's parts with each entry's path where this step reads it: a store's source file
    downloaded from the run's source commit (the plan's copy was in its own step's temporary
    folder), a local one where it lies (the sources folder every step mounts)."""
    commit = group["source_commit"]
    if commit is None:
        return list(group["parts"])
    return [dataclasses.replace(part, entries=tuple(
        dataclasses.replace(e, path=store.download(commit, SOURCES_PREFIX + e.source_key, dest / e.source_key))
        for e in part.entries)) for part in group["parts"]]
