"""Small lineage records and a local store holding them, for tests without a training run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from core.registry import lineage_path, version_tag
from resources.store.base import MAIN
from resources.store.factory import make_store

BASE = {
    "model": "toy",
    "version": 1,
    "created_at": "2026-11-29T10:00:00+00:00",
    "checkpoint": {"uri": "file:///tmp/w.pt", "sha256": "a" * 64, "store_path": "models/toy/checkpoints/r/model.safetensors",
                   "commit": "c" * 64},
    "data": {"backend": "local", "repository": "model-factory", "dataset": "toy", "raw_commit": "1" * 64,
             "shards_commit": "2" * 64, "manifest_path": "datasets/toy/shards/manifest.json"},
    "code": {"git_sha": "f" * 40, "dirty": False},
    "environment": {"python": "3.11.7", "torch": "2.13.0+cpu", "platform": "Linux"},
    "training": {
        "config": {"model": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
                   "train": {"epochs": 3, "lr": 0.003, "seed": 0, "batch_size": 32},
                   "data": {"commit_id": "2" * 64, "locations": {}, "manifest": {"splits": {
                       "train": {"num_samples": 100}, "test": {"num_samples": 20}}}},
                   "checkpoint": {"dir": "/tmp/ckpt", "every_steps": 40},
                   "output_dir": "/tmp/out", "world_size": 2, "backend": "gloo"},
        "seed": 0, "world_size": 2, "backend": "gloo"},
    "training_figures": {"final_loss": 0.05, "samples_per_second": 1000.0, "steps": 12},
    "evaluation": {"test": {"accuracy": 0.95, "loss": 0.12, "num_samples": 20},
                   "validation": {"accuracy": 0.9, "loss": 0.2, "num_samples": 10}},
    "quality_gate": {"passed": True, "failures": []},
    "checks": {},
    "dagster": {"run_id": "run-1", "run_url": "http://localhost:3000/runs/run-1"},
    "links": {},
}


def make_record(version: int = 1, **changes: object) -> dict:
    """BASE with dotted-path changes, e.g. ``make_record(2, **{"training.config.train.lr": 0.01})``."""
    record = copy.deepcopy(BASE)
    record["version"] = version
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = record
        for p in parents:
            node = node[p]
        node[leaf] = value
    return record


def store_with_versions(root: Path, model: str = "toy", versions: int = 2):
    """A local store where ``model`` has versions 1..N, each tagged like the registry does."""
    store = make_store("local", root=root, repository="model-factory")
    store.ensure_repository()
    for v in range(1, versions + 1):
        record = make_record(v, model=model)
        store.put_object(MAIN, lineage_path(model, v), json.dumps(record).encode())
        commit = store.commit(MAIN, f"Register {model} v{v}", {})
        store.create_tag(version_tag(model, v), commit.id)
    return store
