"""What a training leaves in its output directory besides the model: the pieces of
resolved_config.json and metrics.json that are not the context's own."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch


def accelerator_versions(device: torch.device) -> dict[str, Any]:
    """CUDA, cuDNN and NCCL versions and the GPU model this rank trained on, as the process saw
    them (the image's libraries, not the orchestrator's)."""
    if device.type != "cuda":
        return {}
    nccl = torch.cuda.nccl.version()
    return {"cuda_version": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version(),
            "nccl_version": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            "gpu_name": torch.cuda.get_device_name(device)}


def json_safe(obj: Any) -> Any:
    """Metrics as JSON: non-finite floats become strings rather than invalid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def read_metrics(output_dir: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(output_dir) / "metrics.json").read_text())
