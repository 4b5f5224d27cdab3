"""What the elastic gang tests share: a problem whose feature 0 names each sample, the config a
team's own training function (tests/runtime/sample_order_train.py) runs with, and the check that the steps each
attempt kept hold every epoch's samples exactly once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.runtime.helpers import make_config, make_id_dataset
from tests.runtime.sample_order_train import ID_SCALE
from training_runtime.data.sampling import rank_epoch_indices
from training_runtime.distributed.elastic import elastic_partitions


def problem(root: Path, n: int, per_shard: int) -> tuple[dict, dict]:
    return make_id_dataset(root, n, per_shard, 32, ID_SCALE)


def elastic_config(root: Path, manifest: dict, locations: dict, *, nodes: tuple[int, int], per_node: int,
                   batch: int, epochs: int, every: int, name: str = "elastic") -> dict:
    """The runtime config ops/training_config.py makes for an elastic recipe, with the team's function."""
    cfg = make_config(root, manifest, locations, name=name, batch_size=batch, epochs=epochs)
    cfg["checkpoint"]["every_steps"] = every
    cfg["train_fn"] = "tests.runtime.sample_order_train:main"
    cfg["data"]["partitions"] = elastic_partitions(*nodes, per_node)
    return cfg


def kept_rows(cfg: dict) -> list[dict]:
    """Each attempt's recorded steps up to the step the next attempt resumed from."""
    rows = [json.loads(line) for p in (Path(cfg["checkpoint"]["dir"]).parent / "seen").glob("*.jsonl")
            for line in p.read_text().splitlines()]
    starts = sorted({r["resumed_from"] or 0 for r in rows})
    return [r for r in rows if r["step"] <= next((s for s in starts if s > (r["resumed_from"] or 0)), 10 ** 9)]


def check_whole_epochs(cfg: dict, manifest: dict, metrics: dict, *, batch: int) -> list[dict]:
    """Every optimizer step kept once with a whole global batch, and each epoch's samples, counted
    over the ranks of every attempt, exactly the epoch's (no padding: the split divides the batch)."""
    kept = kept_rows(cfg)
    by_step = Counter(r["step"] for r in kept for _ in r["ids"])
    assert set(by_step) == set(range(1, metrics["steps"] + 1)) and set(by_step.values()) == {batch}, by_step
    resolved = json.loads((Path(cfg["output_dir"]) / "resolved_config.json").read_text())
    sizes = [s["num_samples"] for s in manifest["splits"]["train"]["shards"]]
    n = sum(sizes)
    per_epoch = n // batch
    for epoch in range(metrics["steps"] // per_epoch):
        seen = Counter(i for r in kept if (r["step"] - 1) // per_epoch == epoch for i in r["ids"])
        whole = rank_epoch_indices(sizes, cfg["train"]["seed"], epoch, resolved["data"]["partitions"], 1, 0, batch,
                                   resolved["data"]["shuffle_block"])
        assert seen == Counter(whole.tolist()) == Counter(range(n)), f"epoch {epoch}"
    return kept
