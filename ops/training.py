"""The distributed training op: launch the runtime on the pinned shards, collect its results."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from assets import plots, training
from assets.spec import PipelineSpec
from resources.launch.base import TrainingLauncher
from resources.store.base import VersionedStore


@dataclass
class TrainingResult:
    output_dir: Path
    metrics: dict
    resolved_config: dict
    weights_sha256: str
    telemetry: list[dict] = field(default_factory=list)

    def metadata(self, model: str) -> dict:
        figures = training.training_figures(self.metrics)
        meta: dict = {k: v for k, v in figures.items() if v is not None}
        meta["weights_sha256"] = self.weights_sha256
        meta["backend"] = str(self.metrics.get("backend"))
        if self.metrics.get("per_rank_step_time_s"):
            meta["per_rank_step_time_s"] = dg.MetadataValue.json(self.metrics["per_rank_step_time_s"])
        if self.metrics.get("loss_history"):
            png = plots.loss_curve_png(self.metrics["loss_history"], f"{model}: training loss")
            meta["loss_curve"] = dg.MetadataValue.md(plots.markdown_image(png, "loss curve"))
        if self.telemetry:
            last = self.telemetry[-1]
            meta["last_telemetry"] = dg.MetadataValue.json(last)
        return meta


def run_distributed_training(
    context: dg.AssetExecutionContext, spec: PipelineSpec, shards: dict, store: VersionedStore,
    launcher: TrainingLauncher, work_dir: Path,
) -> TrainingResult:
    """Train on the shards at their pinned commit; resumes from ``work_dir``'s checkpoints."""
    manifest = json.loads(store.get_object(shards["commit_id"], shards["manifest_path"]))
    locations = training.shard_locations(store, shards["commit_id"], shards["prefix"], manifest)
    output_dir = work_dir / "output"
    config = training.runtime_config(
        spec, manifest=manifest, locations=locations, commit_id=shards["commit_id"],
        checkpoint_dir=work_dir / "checkpoints", output_dir=output_dir,
        s3_endpoint_url=_s3_endpoint(store, shards["commit_id"], shards["manifest_path"]),
    )
    job = training.training_job(spec, context.run_id, config)
    context.log.info(f"Launching {job.nnodes}x{job.nproc_per_node} training workers for {spec.name} "
                     f"on shards commit {shards['commit_id'][:12]}")
    invocation = launcher.launch(context, job)
    telemetry = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and m.get("kind") == "telemetry"]
    metrics_file = output_dir / "metrics.json"
    if not metrics_file.exists():
        raise dg.Failure(description=f"training finished without writing {metrics_file}; see the run's logs")
    weights = output_dir / "weights.pt"
    return TrainingResult(
        output_dir=output_dir,
        metrics=json.loads(metrics_file.read_text()),
        resolved_config=json.loads((output_dir / "resolved_config.json").read_text()),
        weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
        telemetry=telemetry,
    )


def _s3_endpoint(store: VersionedStore, commit_id: str, path: str) -> str | None:
    return store.pinned_location(commit_id, path).s3_endpoint_url
