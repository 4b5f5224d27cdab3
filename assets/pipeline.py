"""The four assets of one model pipeline: raw dataset -> shards -> checkpoint -> model version.

Bodies stay short: each hands its work to plain functions and only wires store commits,
data versions and metadata together.
"""


import hashlib
import json
import tempfile
from pathlib import Path

import dagster as dg

from assets import ingest, lineage, plots, training, versions
from assets.runs import commit_metadata, commit_or_head, ensure_run_branch, root_run_id
from assets.sharding import build_shards
from assets.source import SourceError, load_frame
from assets.spec import PipelineSpec
from resources.platform import (
    ArtifactStoreResource,
    PlatformSettings,
    TrainingLauncherResource,
    VersionedStoreResource,
)


def asset_keys(name: str) -> dict[str, dg.AssetKey]:
    return {stage: dg.AssetKey([name, stage]) for stage in ("raw_dataset", "shards", "checkpoint", "model_version")}


def build_pipeline_assets(spec: PipelineSpec) -> list[dg.AssetsDefinition]:
    keys = asset_keys(spec.name)
    name = spec.name

    @dg.asset(key=keys["raw_dataset"], group_name=name, kinds={"parquet"},
              description=f"Source data of {name}, validated and committed to the run branch.")
    def raw_dataset(context: dg.AssetExecutionContext, platform: PlatformSettings,
                    store: VersionedStoreResource) -> dg.Output[dict]:
        s = store.get()
        try:
            frame, sources = load_frame(spec, platform.sources_root)
        except SourceError as exc:
            raise dg.Failure(description=str(exc)) from exc
        branch = ensure_run_branch(s, context.run_id)
        ingest.write_raw(s, branch, name, frame, sources)
        commit_id = commit_or_head(s, branch, f"Ingest raw data of {name}",
                                   commit_metadata(context, platform.run_url(context.run_id), rows=str(len(frame))))
        value = {"dataset": name, "commit_id": commit_id, "path": ingest.raw_path(name), "rows": len(frame),
                 "branch": branch}
        return dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
            "commit_id": commit_id, "rows": len(frame), "columns": len(frame.columns),
            "sources": dg.MetadataValue.json(sources), "store_link": _link(s, commit_id)})

    @dg.asset(key=keys["shards"], group_name=name, ins={"raw": dg.AssetIn(keys["raw_dataset"])}, kinds={"numpy"},
              description=f"Seeded train/validation/test split of {name} as checksummed binary shards.")
    def shards(context: dg.AssetExecutionContext, raw: dict, platform: PlatformSettings,
               store: VersionedStoreResource) -> dg.Output[dict]:
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        frame = ingest.read_raw(s, raw["commit_id"], name)
        prefix = ingest.dataset_prefix(name) + "shards/"
        with tempfile.TemporaryDirectory(prefix="shards-") as tmp:
            try:
                manifest = build_shards(
                    frame, out_dir=Path(tmp), feature_columns=spec.feature_columns, label_column=spec.label_column,
                    class_names=spec.class_names, id_column=spec.id_column, feature_shape=spec.shape,
                    seed=spec.split.seed, fractions=(spec.split.train, spec.split.validation, spec.split.test),
                    samples_per_shard=spec.split.samples_per_shard)
            except ValueError as exc:
                raise dg.Failure(description=f"pipeline {name!r}: cannot shard the raw data: {exc}") from exc
            manifest["source_commit"] = raw["commit_id"]
            _replace_prefix(s, branch, prefix, Path(tmp), manifest)
        commit_id = commit_or_head(s, branch, f"Shard {name}", commit_metadata(
            context, platform.run_url(context.run_id), raw_commit=raw["commit_id"]))
        counts = {k: v["num_samples"] for k, v in manifest["splits"].items()}
        value = {"dataset": name, "commit_id": commit_id, "prefix": prefix, "manifest_path": prefix + "manifest.json",
                 "raw_commit": raw["commit_id"], "num_samples": counts}
        return dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
            "commit_id": commit_id, **{f"{k}_samples": n for k, n in counts.items()},
            "shards": sum(len(v["shards"]) for v in manifest["splits"].values()), "store_link": _link(s, commit_id)})

    @dg.asset(key=keys["checkpoint"], group_name=name, ins={"shards": dg.AssetIn(keys["shards"])},
              kinds={"pytorch"}, retry_policy=dg.RetryPolicy(max_retries=1, delay=2),
              description=f"{spec.model} trained on {name}'s shards by the distributed training op (torchrun).")
    def checkpoint(context: dg.AssetExecutionContext, shards: dict, platform: PlatformSettings,
                   store: VersionedStoreResource, artifacts: ArtifactStoreResource,
                   launcher: TrainingLauncherResource) -> dg.Output[dict]:
        from ops.training import run_distributed_training

        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        result = run_distributed_training(context, spec, shards, s, launcher.get(),
                                          platform.checkpoints_root / name / root_run_id(context))
        weights_path = f"models/{name}/checkpoints/{context.run_id}/weights.pt"
        weights_uri = artifacts.get().put_file(result.output_dir / "weights.pt", weights_path)
        s.put_file(branch, weights_path, result.output_dir / "weights.pt")
        for extra in ("resolved_config.json", "metrics.json"):
            s.put_file(branch, weights_path.replace("weights.pt", extra), result.output_dir / extra)
        commit_id = commit_or_head(s, branch, f"Train {name}", commit_metadata(
            context, platform.run_url(context.run_id), shards_commit=shards["commit_id"]))
        value = {"commit_id": commit_id, "weights_path": weights_path, "weights_uri": weights_uri,
                 "weights_sha256": result.weights_sha256, "shards_commit": shards["commit_id"]}
        return dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
            **result.metadata(name), "commit_id": commit_id, "weights_uri": weights_uri})

    @dg.asset(key=keys["model_version"], group_name=name, kinds={"pytorch"},
              ins={"checkpoint": dg.AssetIn(keys["checkpoint"]), "shards": dg.AssetIn(keys["shards"]),
                   "raw": dg.AssetIn(keys["raw_dataset"])},
              description=f"{name} evaluated on the held-out test split, registered and published if it passes the gate.")
    def model_version(context: dg.AssetExecutionContext, checkpoint: dict, shards: dict, raw: dict,
                      platform: PlatformSettings, store: VersionedStoreResource) -> dg.Output[dict]:
        from ops.evaluation import evaluate_and_register

        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        outcome = evaluate_and_register(context, spec, s, branch, checkpoint, shards, raw,
                                        platform.run_url(context.run_id))
        return dg.Output(outcome.value, data_version=dg.DataVersion(outcome.value["commit_id"]),
                         metadata=outcome.metadata)

    return [raw_dataset, shards, checkpoint, model_version]


def _link(store, ref: str) -> dg.MetadataValue | str:
    link = store.ui_link(ref)
    return dg.MetadataValue.url(link) if link else ref


def _replace_prefix(store, branch: str, prefix: str, local_dir: Path, manifest: dict) -> None:
    """Make ``prefix`` on the branch hold exactly the new shards (old shard files removed)."""
    new_paths = {prefix + e["path"] for split in manifest["splits"].values() for e in split["shards"]}
    for obj in store.list_objects(branch, prefix=prefix):
        if obj.path not in new_paths and obj.path != prefix + "manifest.json":
            store.delete_object(branch, obj.path)
    for rel in sorted(new_paths):
        store.put_file(branch, rel, local_dir / rel[len(prefix):])
    store.put_object(branch, prefix + "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
