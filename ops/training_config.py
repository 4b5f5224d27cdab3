"""The training op's pure parts: the runtime config from a recipe, the job, and figures from results."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

from core.spec import PipelineSpec
from resources.launch.base import GpuRequest, TrainingJob
from training_runtime.distributed.elastic import elastic_partitions


def runtime_config(
    spec: PipelineSpec, *, manifest: dict, locations: dict[str, str], commit_id: str,
    checkpoint_dir: Path, output_dir: Path, s3_endpoint_url: str | None = None, launch: int = 1,
) -> dict:
    """``launch``: which launch of this training (training_runtime.observe.attempts.next_launch)."""
    r = spec.recipe
    # An elastic gang's every size holds whole partitions of the sample order (distributed/elastic.py).
    elastic = ({"partitions": elastic_partitions(r.min_nodes, r.nnodes, r.gpus_per_node or r.world_size)}
               if r.min_nodes is not None and r.min_nodes < r.nnodes else {})
    return {
        "model": {"name": spec.model, "kwargs": dict(spec.model_kwargs)},
        "data": {"commit_id": commit_id, "manifest": manifest, "locations": locations,
                 "s3_endpoint_url": s3_endpoint_url, **elastic,
                 # s3:// shards are cached by sha256 beside the run's checkpoints
                 "cache_dir": str(checkpoint_dir.parent / "shard-cache")},
        "train": {
            "epochs": r.epochs, "batch_size": r.batch_size, "lr": r.lr, "optimizer": r.optimizer,
            "weight_decay": r.weight_decay, "lr_schedule": r.lr_schedule, "warmup_steps": r.warmup_steps,
            "grad_accum_steps": r.grad_accum_steps, "seed": r.seed, "sharding": r.sharding,
            "precision": r.precision, "fsdp_units": r.fsdp_units, "fsdp_unit_params": r.fsdp_unit_params,
            "activation_checkpointing": r.activation_checkpointing,
            # A job that holds GPUs must train on them: the runtime fails with the reason instead of
            # falling back to CPU; a CPU job never touches a GPU.
            "device": "cuda" if r.gpus_per_node else "cpu",
            "tf32": r.tf32, "deterministic": r.deterministic, "grad_clip_norm": r.grad_clip_norm,
            "compile": r.compile, "collective_timeout_s": r.collective_timeout_s, "io_timeout_s": r.io_timeout_s,
            "num_workers": r.loader_threads, "prefetch_batches": r.prefetch_batches,
            "augment": {"padding": r.augment_padding, "hflip": r.augment_hflip},
        },
        "task": spec.task,
        "train_fn": spec.train,
        # Validation needs the split; shards of every pipeline have one (Split's fractions are positive).
        "validation": {"enabled": "validation" in manifest["splits"], "every_steps": r.validate_every_steps,
                       "metric": r.monitor, "mode": r.monitor_mode, "patience": r.early_stopping_patience,
                       "keep_best": r.keep_best},
        # The pipeline's guard settings, checked against the recipe's collective timeout at load.
        "guards": dataclasses.asdict(spec.guards),
        "checkpoint": {"dir": str(checkpoint_dir), "every_steps": r.checkpoint_every_steps,
                       "keep_last": r.keep_last_checkpoints, "async_save": r.async_checkpoint,
                       "format": r.checkpoint_format},
        "output_dir": str(output_dir),
        # evaluate_on "training": rank 0 evaluates the written weights on its GPU and writes evaluation.json.
        "evaluation": {"enabled": r.evaluate_on == "training"},
        "launch": launch,
    }


def training_job(spec: PipelineSpec, run_id: str, config: dict) -> TrainingJob:
    r, p = spec.recipe, spec.placement
    # One Job per training: ``run_id`` is the root run (ops/runs.py root_run_id), so every retry of
    # this asset's step names the same Job, which the launcher replaces before starting its own
    # (resources/k8s/client.py replace_previous); the checkpoint directory's hash keeps apart
    # trainings of one run that write to different directories. Kubernetes object names:
    # lowercase alphanumerics and '-', at most 63 characters (45 + 1 + 8 + 1 + 8).
    name = "-".join((re.sub(r"[^a-z0-9-]", "-", spec.name.lower())[:45].strip("-"), run_id[:8].lower(),
                     hashlib.sha256(config["checkpoint"]["dir"].encode()).hexdigest()[:8]))
    return TrainingJob(
        name=name,
        config=config,
        nproc_per_node=r.gpus_per_node or r.world_size,
        nnodes=r.nnodes,
        min_nodes=r.min_nodes if r.min_nodes is not None and r.min_nodes < r.nnodes else None,
        max_restarts=r.max_restarts,
        team=spec.team,
        gpu=GpuRequest(nodes=r.nnodes, gpus_per_node=r.gpus_per_node, resource_name=r.gpu_resource_name,
                       cpu_per_gpu=r.cpu_per_gpu, memory_gib_per_gpu=r.memory_gib_per_gpu,
                       shm_gib_per_gpu=r.shm_gib_per_gpu,
                       # Placement (validated when definitions load); the priority class, if the
                       # pipeline names none, is chosen by the launcher from the run's origin.
                       node_selector=dict(p.node_selector), tolerations=tuple(dict(t) for t in p.tolerations),
                       affinity=p.affinity, priority_class=p.priority_class,
                       cpu=p.cpu, memory=p.memory, shm_size=p.shm),
    )


def training_figures(metrics: dict) -> dict[str, float | int | None]:
    """The final numbers Dagster plots across runs."""
    keys = ("final_loss", "samples_per_second", "data_wait_share", "steps", "epochs", "world_size",
            "checkpoint_stall_s_total", "resumed_from_step", "best_step", "best_value", "stopped_early")
    return {k: metrics.get(k) for k in keys}
