"""Evaluate a finished run's weights on a manifest split, in one process on CPU."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .config import validate_manifest
from .data import SplitData, resolve_shards
from .models import build_model


def load_trained_model(output_dir: Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Rebuild the model from ``resolved_config.json`` and load ``weights.pt`` (weights only)."""
    output_dir = Path(output_dir)
    cfg_path, w_path = output_dir / "resolved_config.json", output_dir / "weights.pt"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist; output_dir must hold a finished training run")
    resolved = json.loads(cfg_path.read_text())
    man = resolved["data"]["manifest"]
    model = build_model(resolved["model"]["name"], man["feature_shape"], man["num_classes"],
                        **resolved["model"]["kwargs"])
    model.load_state_dict(torch.load(w_path, map_location="cpu", weights_only=True))
    model.eval()
    return model, resolved


@torch.no_grad()
def evaluate(output_dir: Path, manifest: dict, locations: dict[str, str], split: str = "test",
             s3_endpoint_url: str | None = None, batch_size: int = 1024,
             cache_dir: str | None = None) -> dict[str, Any]:
    """Accuracy, mean cross-entropy loss and per-class accuracy of the trained model on ``split``.
    Shards are checked against their sha256 before use. Classes without samples in the split are
    left out of ``per_class_accuracy``; ``per_class_num_samples`` gives the counts."""
    validate_manifest(manifest)
    model, resolved = load_trained_model(output_dir)
    trained = resolved["data"]["manifest"]
    if list(trained["feature_shape"]) != list(manifest["feature_shape"]) or \
            trained["num_classes"] != manifest["num_classes"]:
        raise ValueError(
            f"manifest feature_shape {manifest['feature_shape']} / num_classes {manifest['num_classes']} "
            f"do not match the trained model's {trained['feature_shape']} / {trained['num_classes']}")
    if cache_dir is None:
        cache_dir = str(Path(tempfile.gettempdir()) / "training_runtime_shard_cache")
    paths = resolve_shards(manifest, locations, split, cache_dir, s3_endpoint_url, verify=True)
    data = SplitData(manifest, paths, split)
    nc = manifest["num_classes"]
    names = manifest.get("class_names") or [str(i) for i in range(nc)]
    loss_sum = 0.0
    correct = np.zeros(nc, dtype=np.int64)
    count = np.zeros(nc, dtype=np.int64)
    for start in range(0, data.num_samples, batch_size):
        idx = np.arange(start, min(start + batch_size, data.num_samples))
        x, y = data.gather(idx)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        logits = model(xt).float()
        loss_sum += F.cross_entropy(logits, yt, reduction="sum").item()
        hit = (logits.argmax(dim=1) == yt).numpy()
        np.add.at(count, y, 1)
        np.add.at(correct, y, hit.astype(np.int64))
    n = data.num_samples
    return {
        "accuracy": float(correct.sum() / n),
        "loss": loss_sum / n,
        "num_samples": n,
        "split": split,
        "per_class_accuracy": {names[c]: float(correct[c] / count[c]) for c in range(nc) if count[c]},
        "per_class_num_samples": {names[c]: int(count[c]) for c in range(nc)},
    }
