"""Run as ``python -m tests.runtime.save_same_state OUT_DIR SEED``: save one fixed model state and
one fixed lineage record in this (fresh) process, filling the record's dicts in an order drawn
from SEED, and print the sha256 of each file written, as JSON.

tests/runtime/test_byte_stable_artifacts.py starts several of these: hash-map orders and dict
insertion orders differ between processes, the bytes must not."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

import torch

from core.lineage import lineage_bytes
from tests.runtime.test_model_card import TABLE_MANIFEST, trained_card
from training_runtime.serve.card import CARD_FILE, WEIGHTS_FILE, save_model

RECORD = {"model": "toy", "version": 3, "created_at": "2026-12-01T10:00:00+00:00",
          "checkpoint": {"sha256": "a" * 64, "uri": "file:///w", "commit": "c" * 64},
          "data": {"dataset": "toy", "dataset_version": "toy-d1", "shards_commit": "2" * 64, "raw_commit": "1" * 64},
          "training": {"config": {"train": {"lr": 0.003, "seed": 0, "epochs": 3}, "model": {"name": "mlp"}},
                       "world_size": 2, "detections": [{"detector": "straggler", "rank": 1}]},
          "evaluation": {"test": {"accuracy": 0.9711, "loss": 0.098, "num_samples": 180}}}


def shuffled(value, rng: random.Random):
    """The same content with every dict's keys inserted in a random order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def main(out: Path, seed: int) -> dict[str, str]:
    model, card, _ = trained_card("mlp", TABLE_MANIFEST, {"hidden_sizes": [8, 8]})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["extra.scale"] = torch.full((3,), 0.5)  # a few names more: more header entries to order
    save_model(out, state, shuffled(card, random.Random(seed)))
    (out / "lineage.json").write_bytes(lineage_bytes(shuffled(RECORD, random.Random(seed))))
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest()
            for name in (WEIGHTS_FILE, CARD_FILE, "lineage.json")}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
