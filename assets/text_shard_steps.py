"""The shards asset of a text corpus, its new parts tokenized over Dagster steps.

A corpus is cut into content-defined parts (assets/kinds/text.py ``plan_text_parts``) and a new
version keeps the published version's parts of the same key (assets/kinds/text_store.py). What is
left, the new parts, is what costs: tokenizing a billion documents in one step would be one pod
for the whole corpus, and one failure would redo all of it. So the asset is a graph (Dagster's
``graph_asset``) of three ops, as an image folder's is (assets/image_shard_steps.py):

- ``plan`` reads the raw copy's ids, text hashes and labels, by ranged reads of those columns
  alone (the texts stay in the store; training a BPE tokenizer here reads the training split's
  texts too) and settles the tokenizer: the byte one, the
  published BPE ``tokenizer.json`` while ``tokenizer``, ``vocab_size`` and ``function`` are
  unchanged, or a BPE one trained here, once, on the whole training split, and staged on the run's
  branch so every group encodes with the same file. It then cuts the parts (their keys hold the
  tokenizer's sha256) and hands the new ones, ``source.parts_per_step`` to a group, to one dynamic
  output each (``DynamicOut``); a second output carries the plan to ``publish``.
- ``shard_parts``, mapped over the groups: a step each (a pod each with the Kubernetes executor),
  with the transient retry policy, so a failed group is retried alone. It reads only the footer
  and the raw copy's row groups that hold its parts' documents, by byte range from any store
  (``store.open_object``; on lakeFS, HTTP Range requests), and logs how many bytes of the raw
  copy that was; it tokenizes and shards them exactly as a
  single-step build does (``TextSharder.write_parts``), reads its files back
  (text_shard_checks.py ``check_part_files``) and stages them on the run's branch, uncommitted.
- ``publish`` (after ``collect``) assembles the manifest from the plan, the groups' records and
  the published version's kept parts (``text_manifest``, the single-step build's own assembly, so
  the bytes are the same), runs the split-level checks, and makes one commit. A version is all its
  parts or none; a re-execution from failure runs only the failed groups, the others' records
  come from Dagster's IO manager and their staged files are copied from the earlier run's branch.

Dynamic outputs rather than Dagster partitions or a backfill, for the reasons the image module
gives: the groups are known only once the raw copy is read (they are the parts that changed), they
are not a dimension users select or schedule, and partitions would let each group publish alone.
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import json
import tempfile
from pathlib import Path

import dagster as dg

from assets.shard_steps import carry_raw_commit, step_groups
from assets.kinds import text_store
from assets.kinds.image_store import put_shards, strip_carried
from assets.kinds.text import TextPlan, TextSharder, part_from_dict, part_to_dict, previous_parts, \
    text_manifest, tokenizer_of
from assets.kinds.text_shard_checks import check_part_files
from assets.kinds.text_tokens import TOKENIZER_FILE
from assets.quality.runner import QualityReport
from assets.reuse import REUSED, reused_shards
from assets.sharding import CARRIED
from assets.shards_output import shards_outputs, stamp_manifest
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource

CHECK = "shard_expectations"


def plan_groups(plan: TextPlan, kept: set[str], per_step: int) -> list[list[dict]]:
    """The plan's parts that ``kept`` (the published version's part keys) does not hold, as the
    dicts a step is handed, ``per_step`` to a group, in raw-copy order."""
    return step_groups([part_to_dict(p) for p in plan.parts], kept, per_step)


def made_parts(groups: list[dict], shard_prefix: str) -> tuple[dict[str, tuple[dict, dict]], list[str], dict[str, str]]:
    """({part key: (record, shard entries per split)}, the groups' file problems, staged store
    path -> the branch it was staged on) from the ``shard_parts`` steps' results."""
    by_key, failures, staged = {}, [], {}
    for group in groups:
        failures += group["failures"]
        for record, entries in zip(group["records"], group["entries"]):
            by_key[record["key"]] = (record, entries)
            staged.update({shard_prefix + e["path"]: group["branch"] for es in entries.values() for e in es})
    return by_key, failures, staged


def all_carried(manifest: dict) -> dict:
    """The manifest with every shard marked ``CARRIED``: the split-level checks judge each by its
    part's record; the steps read the new ones back, the published version its own."""
    return {**manifest, "splits": {s: {**info, "shards": [{**e, CARRIED: True} for e in info["shards"]]}
                                   for s, info in manifest["splits"].items()}}


def build_text_shards_asset(spec: PipelineSpec, kind, keys: dict[str, dg.AssetKey], checked) -> dg.AssetsDefinition:
    name = spec.name
    shard_prefix = f"datasets/{name}/shards/"
    key = keys["shards"]
    ident = key.to_python_identifier()
    check_spec = dg.AssetCheckSpec(CHECK, asset=key, blocking=True,
                                   description="Counts, split fractions, labels and checksums of the shards.")

    def cannot_shard(exc: ValueError) -> dg.Failure:  # bad data or spec: a retry gives the same answer
        return dg.Failure(description=f"pipeline {name!r}: cannot shard the raw data: {exc}", allow_retries=False)

    @dg.op(name=f"{ident}_plan", out={"groups": dg.DynamicOut(), "plan": dg.Out()}, retry_policy=TRANSIENT_RETRY)
    def plan(context, raw: dict, store: VersionedStoreResource):
        if raw.get(REUSED):
            yield dg.Output(None, "plan")
            return
        s = store.get()
        with tempfile.TemporaryDirectory(prefix="text-plan-") as tmp:
            tmp = Path(tmp)
            published = text_store.published_shards(s, spec, shard_prefix, tmp)
            # Ranged reads: the ids and text hashes (and labels), not the texts; the texts of the
            # training split only when a BPE tokenizer is trained here
            with s.open_object(raw["commit_id"], raw["path"]) as source:
                sharder = TextSharder(spec, source, tmp / "out", salt=text_store.part_salt(raw.get("data_key")),
                                      previous=published.manifest, tokenizer_file=published.tokenizer_file)
                try:
                    planned, _ = sharder.plan()
                    kept = set(previous_parts(published.manifest))
                except ValueError as exc:
                    raise cannot_shard(exc) from exc
            read = f"{source.bytes_fetched} of the raw copy's {source.size()} byte(s) read in {source.requests} " \
                   "ranged request(s)"
            tokenizer = None
            if planned.files:  # a BPE tokenizer: every group encodes with this very file
                path = shard_prefix + planned.header["tokenizer"].get("path", TOKENIZER_FILE)
                if published.tokenizer_file is not None:
                    tokenizer = {"ref": published.commit, "path": path}
                else:
                    branch = ensure_run_branch(s, context.run_id)
                    s.put_file(branch, path, tmp / "out" / TOKENIZER_FILE)
                    tokenizer = {"ref": branch, "path": path}
        groups = plan_groups(planned, kept, spec.source.parts_per_step)
        how = ("kept from the published version" if published.tokenizer_file is not None
               else "trained on the training split and staged" if tokenizer else "bytes")
        context.log.info(f"{name}: {sum(map(len, groups))} of {len(planned.parts)} part(s) to tokenize, in "
                         f"{len(groups)} step(s) of up to {spec.source.parts_per_step}; tokenizer: {how}; "
                         f"planned from the raw copy ({read})")
        yield dg.Output({"header": planned.header, "parts": [part_to_dict(p) for p in planned.parts],
                         "documents": planned.documents, "files": planned.files, "tokenizer": tokenizer,
                         "published": published.commit if published.manifest is not None else None}, "plan")
        for i, group in enumerate(groups):
            yield dg.DynamicOutput({"raw_commit": raw["commit_id"], "raw_path": raw["path"], "parts": group,
                                    "tokenizer": tokenizer, "tokenizer_info": planned.header["tokenizer"]},
                                   output_name="groups", mapping_key=f"parts_{i:05d}")

    @dg.op(name=f"{ident}_shard_parts", retry_policy=TRANSIENT_RETRY)
    def shard_parts(context, group: dict, store: VersionedStoreResource) -> dict:
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        with tempfile.TemporaryDirectory(prefix="text-parts-") as tmp:
            tmp = Path(tmp)
            out = tmp / "shards"
            where = group["tokenizer"]
            file = s.download(where["ref"], where["path"], tmp / TOKENIZER_FILE) if where else None
            # Ranged reads: the footer, then only the row groups holding the group's documents.
            with s.open_object(group["raw_commit"], group["raw_path"]) as source:
                sharder = TextSharder(spec, source, out)
                try:
                    made = sharder.write_parts([part_from_dict(p) for p in group["parts"]], set(),
                                               tokenizer_of(group["tokenizer_info"], file))
                except ValueError as exc:
                    raise cannot_shard(exc) from exc
            records, entries = zip(*(made[p["key"]] for p in group["parts"]))
            failures = check_part_files(sharder.header(group["tokenizer_info"]), list(entries), out)
            paths = [e["path"] for es in entries for split in es.values() for e in split]
            for path in paths:  # staged, not committed: publish commits the version
                s.put_file(branch, shard_prefix + path, out / path)
        names = ", ".join(p["name"] for p in group["parts"][:3]) + (" ..." if len(group["parts"]) > 3 else "")
        context.log.info(f"{name}: {len(group['parts'])} part(s) tokenized ({names}), "
                         f"{sum(r['documents'] for r in records)} document(s) ({source.bytes_fetched} of the raw "
                         f"copy's {source.size()} byte(s) read in {source.requests} ranged request(s)): {len(paths)} "
                         f"shard file(s) staged on {branch}"
                         + (f"; {len(failures)} file problem(s)" if failures else ""))
        return {"branch": branch, "failures": failures, "records": list(records), "entries": list(entries)}

    @dg.op(name=f"{ident}_publish", retry_policy=TRANSIENT_RETRY,
           out={"result": dg.Out(), check_spec.get_python_identifier(): dg.Out(is_required=False)})
    def publish(context, raw: dict, planned, made: list, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        if raw.get(REUSED):
            yield from reused_shards(context, s, key, CHECK, name, raw[REUSED])
            return
        branch = ensure_run_branch(s, context.run_id)
        previous = json.loads(s.get_object(planned["published"], shard_prefix + "manifest.json")) \
            if planned["published"] else None
        by_key, failures, staged = made_parts(made, shard_prefix)
        plan_ = TextPlan(planned["header"], [part_from_dict(p) for p in planned["parts"]], planned["documents"],
                         planned["files"])
        try:
            manifest = text_manifest(plan_, {**previous_parts(previous), **by_key})
        except (ValueError, RuntimeError) as exc:  # a part no step made, or a broken published manifest
            raise dg.Failure(description=f"pipeline {name!r}: cannot assemble the version: {exc}",
                             allow_retries=False) from exc
        stamp_manifest(spec, manifest, raw)
        with tempfile.TemporaryDirectory(prefix="shards-") as tmp:
            tmp = Path(tmp)
            if planned["tokenizer"]:  # beside the shards, checked against the manifest, committed
                where = planned["tokenizer"]
                s.download(where["ref"], where["path"], tmp / where["path"][len(shard_prefix):])
            checked_report = kind.check_shards(spec, all_carried(manifest), tmp)
            report = QualityReport(checked_report.asset, checked_report.outcomes, failures + checked_report.failures)
            moved = put_shards(s, branch, shard_prefix, tmp, manifest, planned["published"], staged)
            carry_raw_commit(context, s, raw, branch)
        context.log.info(text_store.sharded_line(name, manifest, previous, moved)
                         + f"; {len(made)} step(s) tokenized the new part(s); one commit")
        yield from shards_outputs(context, s, spec, key, raw, strip_carried(manifest), report, branch, platform,
                                  checked)

    @dg.graph_asset(key=key, group_name=name, ins={"raw": dg.AssetIn(keys["raw_dataset"])}, kinds={"numpy"},
                    check_specs=[check_spec],
                    description=f"{name} tokenized into shards (format v2), split train/validation/test; its "
                                "new parts tokenized over steps.")
    def shards(raw):
        groups, planned = plan(raw)
        made = groups.map(shard_parts).collect()
        return publish(raw, planned, made)

    return shards
