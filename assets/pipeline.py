"""The four assets of one model pipeline: raw dataset -> shards -> checkpoint -> model version.

Bodies stay short: each hands its work to plain functions and only wires store commits,
data versions and metadata together. A table's shards asset is a graph of steps, its parts
sharded over them (assets/table_shard_steps.py), as an image folder's and a text corpus's are; its raw
dataset, when read from files, is one too, its files ingested over steps (assets/table_ingest_steps.py).
"""


import json
import re
import tempfile
from pathlib import Path

import dagster as dg

from assets import append, ingest, quality
from assets.kinds import data_kind
from assets.table_ingest_steps import appended_output, build_table_raw_asset, published_raw, put_raw
from assets.table_shard_steps import build_table_shards_asset
from assets.typed_data import build_typed_data_assets
from assets.source import SourceError, iter_frame_chunks, iter_source_chunks
from assets.source_place import locate_sources, table_source_files
from assets.data_key import data_key, frame_sha256
from assets.reuse import not_reused_line, reused_raw
from core.datasets import plan_dataset_version, reusable_version, tag_published_dataset, validation_report_path
from core.spec import PipelineSpec
from ops.evaluation import build_evaluation_op
from ops.published_dataset import build_published_dataset_op, build_trained_dataset_op
from ops.runs import TRANSIENT_RETRY, commit_metadata, commit_or_head, ensure_run_branch
from ops.training import build_training_op
from ops.training_health import build_training_health_check
from resources.platform import PlatformSettings, VersionedStoreResource
from resources.store.base import MAIN, RefNotFoundError


SOURCE_COMMIT_TAG = "platform/source_commit"  # the store commit whose sources/ a run ingests
SOURCES_PREFIX = "sources/"
RAW_CHECK, SHARDS_CHECK = "raw_expectations", "shard_expectations"


def asset_keys(name: str) -> dict[str, dg.AssetKey]:
    return {stage: dg.AssetKey([name, stage]) for stage in ("raw_dataset", "shards", "checkpoint", "model_version")}


def pipeline_asset_keys(spec: PipelineSpec) -> dict[str, dg.AssetKey]:
    """A shared-dataset pipeline's raw/shards keys are those of the pipeline that owns the data."""
    own, data = asset_keys(spec.name), asset_keys(spec.dataset_name)
    return {"raw_dataset": data["raw_dataset"], "shards": data["shards"], "checkpoint": own["checkpoint"],
            "model_version": own["model_version"]}


def build_pipeline_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    """The pipeline's assets; one that trains on another pipeline's dataset gets only its own two, a
    dataset pipeline only its data."""
    data = [] if spec.dataset else _data_assets(spec)
    return data + (_model_assets(spec) if spec.trains else [])


def build_pipeline_checks(spec: PipelineSpec) -> list[dg.AssetChecksDefinition]:
    """Checks defined apart from their asset: the checkpoint's non-blocking training health."""
    return [build_training_health_check(pipeline_asset_keys(spec)["checkpoint"])] if spec.trains else []


def _data_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    keys = asset_keys(spec.name)
    name = spec.name
    kind = data_kind(spec)
    if kind is not None:  # an image folder or a text corpus
        return build_typed_data_assets(spec, kind, keys, source_commit_tag=SOURCE_COMMIT_TAG, checked=(
            _commit_checked, _gate, _replace_prefix, _publish_dataset, _check_dataset_owner, _link))
    shards = build_table_shards_asset(spec, keys, (_commit_checked, _gate, _replace_prefix, _publish_dataset,
                                                   _check_dataset_owner, _link))
    if spec.source.loader is None:  # files: ingested over steps, a group of files each
        return [build_table_raw_asset(spec, keys, source_commit_tag=SOURCE_COMMIT_TAG, checked=(
            _commit_checked, _gate, _replace_prefix, _publish_dataset, _check_dataset_owner, _link)), shards]

    # a loader function's frame: one step (it is one call, in one process)
    @dg.asset(key=keys["raw_dataset"], group_name=name, kinds={"parquet"}, retry_policy=TRANSIENT_RETRY,
              check_specs=[dg.AssetCheckSpec(RAW_CHECK, asset=keys["raw_dataset"], blocking=True,
                                             description="Great Expectations suite on the source as parsed.")],
              description=f"Source data of {name}, validated and committed to the run branch.")
    def raw_dataset(context: dg.AssetExecutionContext, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        s.ensure_repository()
        _check_dataset_owner(s, spec)
        with tempfile.TemporaryDirectory(prefix="raw-") as tmp:
            chunks, sources, source_commit = _source_chunks(context, spec, s, platform.sources_root, Path(tmp))
            key = data_key(spec, sources)
            reuse = reusable_version(s, name, key)
            if reuse.tag is not None:  # the newest version holds this very data: nothing to make
                yield from reused_raw(context, s, keys["raw_dataset"], RAW_CHECK, name, reuse, ingest.raw_path(name),
                                      ensure_run_branch(s, context.run_id), source_commit)
                return
            context.log.info(not_reused_line(name, reuse, key))
            published = published_raw(s, name)
            try:
                ingested = append.ingest_source(spec, f"{name}/raw_dataset", spec.expectations.raw(spec), chunks,
                                                Path(tmp) / "data.parquet", key=key, published=published)
            except SourceError as exc:
                raise dg.Failure(description=str(exc), allow_retries=False) from exc
            context.log.info(f"{name}: {ingested.how}")
            report = ingested.report
            branch = ensure_run_branch(s, context.run_id)
            if report.passed:  # otherwise only the evidence stays on the run branch; nothing reaches main
                put_raw(s, branch, name, ingested)
            s.put_object(branch, ingest.dataset_prefix(name) + "raw/sources.json",
                         json.dumps(sources, indent=2, sort_keys=True).encode())
        commit_id = _commit_checked(context, s, branch, platform, report, "raw_dataset",
                                    f"Ingest raw data of {name}", rows=str(ingested.rows),
                                    source_commit=source_commit or "")
        value = {"dataset": name, "commit_id": commit_id, "path": ingest.raw_path(name), "rows": ingested.rows,
                 "branch": branch, "source_commit": source_commit, "checks": report.summary(), "data_key": key,
                 **appended_output(ingested, published)}
        yield dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
            "commit_id": commit_id, "rows": ingested.rows, "columns": ingested.columns,
            "sources": dg.MetadataValue.json(sources), "store_link": _link(s, commit_id),
            **({"source_commit": source_commit} if source_commit else {})})
        yield from _gate(context, report, keys["raw_dataset"], RAW_CHECK, commit_id, branch)

    return [raw_dataset, shards]


def _model_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    """Graph-backed assets: each runs ops of ops/ (the distributed training op, the evaluation op)."""
    keys = pipeline_asset_keys(spec)
    name = spec.name
    train, evaluate = build_training_op(spec), build_evaluation_op(spec)
    checkpoint_args = dict(key=keys["checkpoint"], group_name=name, kinds={"pytorch"},
                           tags={"platform/gpus": str(spec.gpus)},
                           description=f"{spec.model} trained on {spec.dataset_name}'s shards{_shared(spec)} by the "
                                       "distributed training op.")
    version_args = dict(key=keys["model_version"], group_name=name, kinds={"pytorch"},
                        automation_condition=dg.AutomationCondition.eager(),
                        description=f"{name} evaluated on the held-out test split, registered and published if it "
                                    "passes the gate.")
    if spec.published_elsewhere:
        # Another location's shards: a dependency for the graph (and the UI), read from the store.
        resolve, read_back = build_published_dataset_op(spec), build_trained_dataset_op(spec)

        @dg.graph_asset(ins={"shards": dg.AssetIn(keys["shards"], dagster_type=dg.Nothing)}, **checkpoint_args)
        def checkpoint(shards):
            return train(resolve(shards))

        @dg.graph_asset(ins={"checkpoint": dg.AssetIn(keys["checkpoint"])}, **version_args)
        def model_version(checkpoint):
            shards, raw = read_back(checkpoint)
            return evaluate(checkpoint, shards, raw)

        return [checkpoint, model_version]

    @dg.graph_asset(ins={"shards": dg.AssetIn(keys["shards"])}, **checkpoint_args)
    def checkpoint(shards):
        return train(shards)

    @dg.graph_asset(ins={"checkpoint": dg.AssetIn(keys["checkpoint"]), "shards": dg.AssetIn(keys["shards"]),
                         "raw": dg.AssetIn(keys["raw_dataset"])}, **version_args)
    def model_version(checkpoint, shards, raw):
        return evaluate(checkpoint, shards, raw)

    return [checkpoint, model_version]


def _shared(spec: PipelineSpec) -> str:
    if spec.published_elsewhere:
        return f" (dataset {spec.dataset!r} published by code location {spec.dataset_location!r})"
    return f" (shared dataset {spec.dataset!r})" if spec.dataset else ""


def published_dataset_specs(spec: PipelineSpec) -> list[dg.AssetSpec]:
    """The owner's shards as an external asset of this location, so the UI draws the dependency."""
    if not spec.published_elsewhere:
        return []
    return [dg.AssetSpec(pipeline_asset_keys(spec)["shards"], kinds={"numpy"},
                         description=f"Shards of {spec.dataset!r}, materialized by code location "
                                     f"{spec.dataset_location!r} and read here as published on main.")]


def _commit_checked(context, store, branch: str, platform: PlatformSettings, report: quality.QualityReport,
                    asset: str, message: str, **extra: str) -> str:
    """Commit the staged data with its validation report; the commit carries ``check_results``."""
    dataset = report.asset.split("/")[0]
    store.put_object(branch, validation_report_path(dataset, asset), report.to_json())
    verdict = "" if report.passed else " (FAILED its expectations; not for main)"
    return commit_or_head(store, branch, message + verdict, commit_metadata(
        context, platform.run_url(context.run_id), check_results=json.dumps(report.summary(), sort_keys=True),
        **extra))


def _gate(context, report: quality.QualityReport, key: dg.AssetKey, check: str, commit_id: str, branch: str):
    """Record the check in Dagster; a failure stops the run here with what failed."""
    yield dg.AssetCheckResult(
        asset_key=key, check_name=check, passed=report.passed, severity=dg.AssetCheckSeverity.ERROR,
        description=("passed" if report.passed else "; ".join(report.failures[:3]))[:1000],
        metadata={"commit_id": commit_id, "evaluated": len(report.outcomes), "failed": len(report.failures),
                  "failures": dg.MetadataValue.json(report.failures[:50]),
                  "report": validation_report_path(report.asset.split("/")[0], key.path[-1]),
                  "engine": report.summary()["engine"]})
    if not report.passed:
        raise dg.Failure(
            description=f"{key.to_user_string()} failed {len(report.failures)} expectation(s): "
                        + "; ".join(report.failures[:8])
                        + f". Nothing reaches main; the run branch {branch!r} keeps the data and the report.",
            metadata={"branch": branch, "commit_id": commit_id}, allow_retries=False)


def source_area(spec: PipelineSpec) -> list[str]:
    """Store prefixes a pipeline ingests from: ``sources/`` + the fixed part of each source path."""
    areas = []
    for pattern in spec.source.paths if spec.source else ():
        if Path(pattern).is_absolute():
            continue
        fixed = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        areas.append(SOURCES_PREFIX + (fixed if "/" not in fixed else fixed.rsplit("/", 1)[0] + "/"))
    return sorted(set(areas))


def _source_chunks(context, spec: PipelineSpec, store, sources_root: Path, tmp: Path):
    """(the source's chunks as parsed, file descriptions, store commit or None).

    Source paths resolve in the store's ``sources/`` area at the run's pinned commit (tag
    ``platform/source_commit``, else main's head) when files there match; otherwise in the local
    sources directory (assets/source_place.py); the log names the place read. Store files are
    first downloaded to ``tmp``. A loader function is simply called, and its frame cut into the
    same chunks.
    """
    rows = spec.chunk_rows
    try:
        if spec.source.loader is not None:
            frame = spec.source.loader()
            return (iter_frame_chunks(frame, rows), [{"loader": spec.source.describe(), "rows": int(len(frame)),
                                                      "sha256": frame_sha256(frame)}], None)
        place = locate_sources(spec, store, sources_root, context.run.tags.get(SOURCE_COMMIT_TAG)
                               or store.resolve_ref(MAIN))
        (context.log.warning if place.hidden else context.log.info)(place.describe())
        files, described = table_source_files(spec, store, place, tmp)
        return iter_source_chunks(spec, files, rows), described, place.commit
    except SourceError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc


def _publish_dataset(context, store, branch: str, platform: PlatformSettings, name: str, commit_id: str) -> str:
    """A dataset pipeline has no model version whose registration would publish its shards: they
    reach main once they pass their checks, tagged as the dataset's next version (a run on unchanged
    data never gets here: it reuses the newest version's commit, assets/reuse.py)."""
    version = plan_dataset_version(store, name, commit_id)
    store.merge(branch, MAIN, f"Publish dataset {name} ({version})",
                commit_metadata(context, platform.run_url(context.run_id), dataset_version=version))
    return tag_published_dataset(store, name, commit_id, planned=version)


def _check_dataset_owner(store, spec: PipelineSpec) -> None:
    """Two code locations publishing one dataset name would overwrite each other's data on main."""
    try:
        published = json.loads(store.get_object(MAIN, ingest.dataset_prefix(spec.name) + "shards/manifest.json"))
    except RefNotFoundError:
        return  # never published
    owner = published.get("location")
    if owner is not None and owner != spec.location:
        raise dg.Failure(description=f"dataset {spec.name!r} on main was published by code location {owner!r}; "
                                     f"pipeline {spec.name!r} of location {spec.location!r} would overwrite it. "
                                     "Rename one of the two pipelines", allow_retries=False)


def _link(store, ref: str) -> dg.MetadataValue | str:
    link = store.ui_link(ref)
    return dg.MetadataValue.url(link) if link else ref


def _replace_prefix(store, branch: str, prefix: str, local_dir: Path, manifest: dict) -> None:
    """Make ``prefix`` on the branch hold exactly the new shards and the files the manifest lists
    besides them (e.g. a trained tokenizer); old shard files are removed."""
    new_paths = {prefix + e["path"] for split in manifest["splits"].values() for e in split["shards"]}
    new_paths |= {prefix + rel for rel in manifest.get("files", [])}
    for obj in store.list_objects(branch, prefix=prefix):
        if obj.path not in new_paths and obj.path != prefix + "manifest.json":
            store.delete_object(branch, obj.path)
    for rel in sorted(new_paths):
        store.put_file(branch, rel, local_dir / rel[len(prefix):])
    store.put_object(branch, prefix + "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
