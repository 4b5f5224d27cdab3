"""``model.safetensors`` and ``model_card.json`` of a training, written without the whole model in
one rank's memory (the weights streamed by ``checkpoint.weights``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training_runtime.atomic_files import atomic_write_bytes
from training_runtime.checkpoint.weights import StoredWeights, copy_file, write_safetensors
from training_runtime.serve.card import CARD_FILE, SAFETENSORS_METADATA, WEIGHTS_FILE, card_bytes


def save_model_files(out_dir: str | Path, weights: Mapping[str, torch.Tensor] | StoredWeights, card: dict, *,
                     writer: bool) -> dict:
    """``serve.card.save_model`` without the whole model in memory: ``model.safetensors`` streamed
    from ``weights`` (a state dict, DTensors included: collective then) or copied from a stored
    file, then ``model_card.json``, each atomically. Returns the card with ``weights`` set on the
    writer, {} elsewhere."""
    out = Path(out_dir)
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    if isinstance(weights, StoredWeights):
        shared, sha = weights.shared, copy_file(weights.path, out / WEIGHTS_FILE) if writer else None
    else:
        shared, sha = write_safetensors(out / WEIGHTS_FILE, weights, SAFETENSORS_METADATA, writer=writer)
    if not writer:
        return {}
    entry: dict[str, Any] = {"file": WEIGHTS_FILE, "sha256": sha}
    if shared:
        entry["shared"] = shared
    card = {**card, "weights": entry}
    atomic_write_bytes(out / CARD_FILE, card_bytes(card))
    return card
