"""The lineage facts only the training processes know: the image's build record, and which node,
pod and GPU model each rank ran on. Gathered once at start from every rank (node names differ
across a multi-node Job) and written by rank 0 into resolved_config.json's ``pod`` section, which
the orchestrator's lineage record carries (core/lineage.py). The image digest is not visible from
inside a container; the Kubernetes launcher adds it from the pod status (resources/k8s/launcher.py)."""

from __future__ import annotations

from typing import Any

import torch

from training_runtime.distributed.process_group import DistInfo, all_gather_object
from training_runtime.observe.build_info import pod_facts


def rank_facts(info: DistInfo) -> dict[str, Any]:
    """This rank's node, pod and GPU model (None on CPU)."""
    gpu = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else None
    return {"rank": info.rank, **{k: v for k, v in pod_facts().items() if k != "image"}, "gpu": gpu}


def gather_pod_record(info: DistInfo, build: dict[str, Any] | None) -> dict[str, Any]:
    """Collective (I/O group): every rank's facts, summarised; identical on all ranks."""
    ranks = sorted(all_gather_object(rank_facts(info), info.io_group), key=lambda r: r["rank"])
    return pod_record(pod_facts()["image"], build, ranks)


def pod_record(image: str | None, build: dict[str, Any] | None, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {
        "image": image,
        # Filled by the Kubernetes launcher from the pods' status once the Job has run; stays
        # empty for a local launch (no image).
        "image_digests": [],
        "build": build,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else (str(nccl) if nccl else None),
        "nodes": sorted({r["node"] for r in ranks if r.get("node")}),
        "gpus": sorted({r["gpu"] for r in ranks if r.get("gpu")}),
        "ranks": ranks,
    }
