"""Evaluation by the training job itself (``evaluation.enabled``, recipe ``evaluate_on: "training"``).

After training, rank 0 evaluates the model the run wrote (``model.safetensors``: the keep_best
weights when keep_best chose them) on the test and validation splits on its training device, and
writes ``evaluation.json`` beside it. The orchestrator's evaluation step then uses these figures
instead of computing them again on CPU, but only when the file names the sha256 of exactly the
weights it registers (``evaluation_for_weights``).

Rank 0 alone evaluates, with the same function the step runs (``evaluate.evaluate``: one process,
the same batches, the same metric sums), so the figures are those of the step for the same
weights; on CUDA they differ from CPU's by float rounding only. The model must fit one device for
inference (fp32 weights and one batch's activations, no gradients or optimizer state); one that
fits only when FSDP shards it over several GPUs keeps the step's evaluation."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import torch

from training_runtime.atomic_files import atomic_write_bytes
from training_runtime.config import EVALUATION_SPLITS, RunConfig
from training_runtime.data.shards import sha256_file
from training_runtime.serve.card import load_model
from training_runtime.serve.evaluate import evaluate

EVALUATION_FILE = "evaluation.json"
EVALUATION_FORMAT = "model-factory.evaluation/v1"
WEIGHTS_FILE = "model.safetensors"


@contextlib.contextmanager
def fp32_matmuls() -> Iterator[None]:
    """True fp32 matmuls and convolutions (no TF32) for the evaluation's duration: the step
    evaluates in fp32 on CPU, and TF32's 10-bit mantissa would move the figures by about 1e-3."""
    precision, cudnn_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


def evaluation_record(metrics: dict[str, dict[str, Any]], weights_sha256: str, device: torch.device) -> dict:
    """What evaluation.json holds: each split's metrics (the shape the step's evaluation computes),
    the sha256 of the weights they are of, and the device they were computed on."""
    missing = [s for s in EVALUATION_SPLITS if s not in metrics]
    if missing:
        raise ValueError(f"evaluation.json needs the metrics of {list(EVALUATION_SPLITS)}; {missing} missing")
    return {"format": EVALUATION_FORMAT, "weights_sha256": weights_sha256, "device": str(device),
            **{s: metrics[s] for s in EVALUATION_SPLITS}}


def evaluate_after_training(cfg: RunConfig, device: torch.device) -> dict:
    """Rank 0, once training has written its outputs: evaluate them on ``device`` and write
    ``<output_dir>/evaluation.json``; returns its record."""
    out = Path(cfg.output_dir)
    weights = out / WEIGHTS_FILE
    if not weights.is_file():
        raise RuntimeError(f"evaluation.enabled: training wrote no {weights}; nothing to evaluate")
    sha = sha256_file(weights)  # of the bytes loaded next: the record vouches for exactly these weights
    with fp32_matmuls():
        loaded = load_model(out, device)
        metrics = {split: evaluate(out, cfg.data.manifest, cfg.data.locations, split=split,
                                   s3_endpoint_url=cfg.data.s3_endpoint_url, batch_size=cfg.evaluation.batch_size,
                                   cache_dir=cfg.cache_dir(), loaded=loaded, device=device)
                   for split in EVALUATION_SPLITS}
    record = evaluation_record(metrics, sha, device)
    atomic_write_bytes(out / EVALUATION_FILE, json.dumps(record, indent=2, sort_keys=True).encode())
    return record


def evaluation_for_weights(record: dict | None, weights_sha256: str) -> tuple[dict | None, str]:
    """The split metrics of an evaluation.json ``record`` when it is of the weights whose sha256 is
    ``weights_sha256``, else None; and, either way, a sentence saying why (for the step's log).
    A record of this format that lacks a split is an error: the training job never writes one."""
    if record is None:
        return None, "the training job wrote no evaluation.json (recipe evaluate_on 'step'): evaluated here on CPU"
    if not isinstance(record, dict) or record.get("format") != EVALUATION_FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        return None, f"evaluation.json is of format {found!r}, not {EVALUATION_FORMAT!r}: evaluated here on CPU"
    if record.get("weights_sha256") != weights_sha256:
        return None, (f"evaluation.json is of weights {str(record.get('weights_sha256'))[:12]}, the checkpoint's are "
                      f"{weights_sha256[:12]}: evaluated here on CPU")
    bad = [s for s in EVALUATION_SPLITS if not isinstance(record.get(s), dict)]
    if bad:
        raise ValueError(f"evaluation.json (weights {weights_sha256[:12]}) has no metrics for {bad}; it must hold "
                         f"{list(EVALUATION_SPLITS)}. Re-run the training, or train with recipe evaluate_on 'step'")
    return {s: record[s] for s in EVALUATION_SPLITS}, f"evaluated by the training job on {record.get('device')}"
