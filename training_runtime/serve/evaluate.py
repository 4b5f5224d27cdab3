"""Evaluate a trained model (a directory with model.safetensors and model_card.json) on a split of
its shards, in one process (on CPU in the orchestrator's evaluation step, on the training device
after training with evaluation.enabled), with its task's metrics: the figures the quality gate and
the model version's lineage use."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from training_runtime.config import validate_manifest
from training_runtime.data.info import DataInfo
from training_runtime.data.shards import resolve_shards
from training_runtime.data.split import open_split
from training_runtime.serve.card import LoadedModel, load_model
from training_runtime.tasks.evaluation import evaluate_split


def check_fits(loaded: LoadedModel, manifest: dict) -> DataInfo:
    """The manifest's DataInfo, refused when its samples are not what the model was trained on."""
    info = DataInfo.from_manifest(manifest)
    trained = loaded.info
    if (info.kind, info.input_column, tuple(info.input_shape), info.num_classes, info.vocab_size) != \
            (trained.kind, trained.input_column, tuple(trained.input_shape), trained.num_classes, trained.vocab_size):
        raise ValueError(
            f"the shards hold {info.kind} samples {info.input_column}{list(info.input_shape)} with "
            f"{info.num_classes} classes / vocabulary {info.vocab_size}; the model was trained on "
            f"{trained.kind} {trained.input_column}{list(trained.input_shape)} with {trained.num_classes} classes / "
            f"vocabulary {trained.vocab_size}")
    return info


def evaluate(model_dir: Path, manifest: dict, locations: dict[str, str], split: str = "test",
             s3_endpoint_url: str | None = None, batch_size: int = 512, cache_dir: str | None = None,
             loaded: LoadedModel | None = None, device: torch.device | None = None) -> dict[str, Any]:
    """The task's metrics of the model in ``model_dir`` on ``split`` (shards checked against their
    sha256 first). ``loaded``: the model already loaded from ``model_dir`` onto ``device`` (None: CPU)."""
    device = device or torch.device("cpu")
    validate_manifest(manifest)
    loaded = loaded or load_model(model_dir, device)
    info = check_fits(loaded, manifest)
    if cache_dir is None:
        cache_dir = str(Path(tempfile.gettempdir()) / "training_runtime_shard_cache")
    paths = resolve_shards(manifest, locations, split, cache_dir, s3_endpoint_url, verify=True)
    data = open_split(manifest, paths, split)
    metrics = evaluate_split(loaded.model, loaded.task, info, data, batch_size=batch_size, device=device)
    metrics["split"] = split
    return metrics
