"""The lineage record of a model version: everything needed to know, and redo, what produced it."""

from __future__ import annotations

import platform
import sys
from datetime import datetime, timezone

from core.code_version import code_version


def build_lineage_record(
    *, model: str, version: int, checkpoint: dict, shards: dict, raw: dict, store_facts: dict[str, str],
    resolved_config: dict, metrics: dict, evaluation: dict, gate: dict, run_id: str, run_url: str,
    links: dict[str, str] | None = None, checks: dict | None = None,
) -> dict:
    import torch  # deferred: loading definitions must not import torch

    train = resolved_config.get("train", {})
    return {
        "model": model,
        "version": version,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": {
            "uri": checkpoint["weights_uri"],
            "sha256": checkpoint["weights_sha256"],
            "store_path": checkpoint["weights_path"],
            "commit": checkpoint["commit_id"],
        },
        "data": {
            **store_facts,
            "dataset": shards["dataset"],
            "raw_commit": raw["commit_id"],
            "shards_commit": shards["commit_id"],
            "manifest_path": shards["manifest_path"],
        },
        "code": code_version(),
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()},
        "training": {
            "config": resolved_config,
            "seed": train.get("seed"),
            "world_size": resolved_config.get("world_size", metrics.get("world_size")),
            "backend": resolved_config.get("backend", metrics.get("backend")),
        },
        "training_figures": {k: metrics.get(k) for k in
                             ("final_loss", "samples_per_second", "data_wait_share", "steps", "epochs",
                              "checkpoint_stall_s_total", "resumed_from_step")},
        "evaluation": evaluation,
        "quality_gate": gate,
        "checks": checks or {},
        "dagster": {"run_id": run_id, "run_url": run_url},
        "links": links or {},
    }


def commit_ids(record: dict) -> dict[str, str]:
    """The store commits a record points at (each must resolve in the store)."""
    return {
        "raw_commit": record["data"]["raw_commit"],
        "shards_commit": record["data"]["shards_commit"],
        "checkpoint_commit": record["checkpoint"]["commit"],
        **({"version_commit": record["version_commit"]} if record.get("version_commit") else {}),
    }
