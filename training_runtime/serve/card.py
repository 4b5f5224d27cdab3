"""A trained model as a directory anyone can serve: ``model.safetensors`` (the state dict, no
pickle) and ``model_card.json`` (everything needed to rebuild and use the model without the
training config), plus ``tokenizer.json`` when the data was tokenized with a trained BPE.

The card records the model factory and its arguments, the task, the input contract (the
``DataInfo`` fields and how raw inputs became samples when sharding), class names, the tokenizer
and the sha256 of the weights, which ``load_model`` checks before it reads a byte of them. Its
``preprocessing`` and ``output`` sections (serve/serving_card.py) state, step by step, how a raw
input becomes the model's input and what the output is, enough to serve without this code.

The same weights and card are the same bytes in every process: one safetensors metadata key
(``SAFETENSORS_METADATA``) and the card as canonical JSON (``card_bytes``).

Directories written before cards existed (``weights.pt`` + ``resolved_config.json``: the v1 table
classifiers) still load: their card is derived from the resolved training config.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from training_runtime.atomic_files import atomic_path, atomic_write_bytes
from training_runtime.data.info import DataInfo
from training_runtime.data.shards import sha256_file
from training_runtime.models.builtin import build_model
from training_runtime.serve.serving_card import output_section, preprocessing_section
from training_runtime.tasks.base import Task
from training_runtime.tasks.registry import resolve_task, task_from_card

CARD_FORMAT = "model-factory.model-card/v1"
CARD_FILE = "model_card.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
LEGACY_WEIGHTS_FILE = "weights.pt"
LEGACY_CONFIG_FILE = "resolved_config.json"
# safetensors 0.8 writes ``__metadata__`` in hash-map order: with two keys or more the header's
# bytes (and so the file's sha256) change from one process to the next for the same tensors.
# One key keeps the bytes stable; everything else about the weights (the card's format, tied
# weights, the sha256) is in the card.
SAFETENSORS_METADATA = {"format": "pt"}


class ModelCardError(ValueError):
    """A model directory that cannot be loaded as it is; the message names the file and the fix."""


@dataclass
class LoadedModel:
    """A model ready to predict: ``model`` is in eval mode on the device it was loaded to."""

    model: torch.nn.Module
    card: dict
    info: DataInfo
    task: Task
    # The text of tokenizer.json when the card names one: kept in memory so the model outlives
    # the (temporary) directory it was loaded from.
    tokenizer_json: str | None = None
    # Where it came from, set by whoever fetched the directory (serving: model, version, tag).
    source: dict = field(default_factory=dict)


# --- writing ---------------------------------------------------------------------------------

def build_card(*, factory: str, kwargs: dict, input_shape: list[int], num_outputs: int, extra_kwargs: dict,
               task_card: dict, info: DataInfo, manifest: Mapping, training: dict) -> dict:
    """The card of a model trained on ``manifest``'s data; ``save_model`` fills in ``weights``.

    ``kwargs`` are the user's model arguments, ``extra_kwargs`` the ones the runtime derived from
    the data (``vocab_size``, ``pad_id``): both are passed to the factory again when loading."""
    clash = sorted(set(kwargs) & set(extra_kwargs))
    if clash:
        raise ModelCardError(f"model arguments {clash} are both in model.kwargs and derived from the data "
                             f"({extra_kwargs}); remove them from model.kwargs")
    input_section = info.describe_input()
    if manifest.get("feature_columns"):
        input_section["feature_columns"] = list(manifest["feature_columns"])
    if manifest.get("preprocessing"):
        input_section["preprocessing"] = dict(manifest["preprocessing"])
    return {
        "format": CARD_FORMAT,
        "model": {"factory": factory, "kwargs": dict(kwargs), "input_shape": [int(d) for d in input_shape],
                  "num_outputs": int(num_outputs), "extra_kwargs": dict(extra_kwargs)},
        "task": dict(task_card),
        "input": input_section,
        # Enough to serve from the card alone (training_runtime/serve/serving_card.py).
        "preprocessing": preprocessing_section(info, manifest, input_section.get("feature_columns")),
        "output": output_section(task_card, info),
        "data_info": data_info_dict(info),
        "class_names": list(info.class_names),
        "tokenizer": tokenizer_section(manifest.get("tokenizer")),
        "weights": None,
        "training": dict(training),
    }


# DataInfo fields a card leaves out when they are None: a ``normalisation: null`` beside an image
# model's real normalisation (in ``preprocessing``) read as if there were none.
OPTIONAL_DATA_INFO = ("normalisation", "target_normalisation")


def data_info_dict(info: DataInfo) -> dict:
    """``info`` as JSON values; ``data_info_from_dict`` turns it back into an equal DataInfo."""
    out = {}
    for f in dataclasses.fields(info):
        value = getattr(info, f.name)
        if value is None and f.name in OPTIONAL_DATA_INFO:
            continue
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = json.loads(json.dumps(dict(value)))  # plain lists and floats, whatever held them
        out[f.name] = value
    return out


def data_info_from_dict(data: Mapping) -> DataInfo:
    known = {f.name for f in dataclasses.fields(DataInfo)}
    data = {**{k: None for k in OPTIONAL_DATA_INFO}, **data}  # left out when None (older cards wrote null)
    missing, unknown = sorted(known - set(data)), sorted(set(data) - known)
    if missing or unknown:
        raise ModelCardError(f"the card's data_info does not describe a DataInfo (missing {missing}, "
                             f"unknown {unknown}); the card was written by another version of the trainer")
    tuples = ("input_shape", "target_shape", "class_names")
    return DataInfo(**{k: tuple(v) if k in tuples else v for k, v in data.items()})


def tokenizer_section(manifest_tokenizer: Mapping | None) -> dict | None:
    """The card's tokenizer: what encodes a prompt; ``file`` is set when it ships as tokenizer.json."""
    if not manifest_tokenizer:
        return None
    kind = manifest_tokenizer.get("kind")
    return {"kind": kind, "vocab_size": manifest_tokenizer.get("vocab_size"),
            "eos_id": manifest_tokenizer.get("eos_id"), "pad_id": manifest_tokenizer.get("pad_id"),
            "file": TOKENIZER_FILE if kind == "bpe" else None}


def save_model(out_dir: str | Path, state_dict: Mapping[str, torch.Tensor], card: dict) -> dict:
    """Write ``model.safetensors`` then ``model_card.json`` (each atomically: a reader finds a
    card only next to the whole weights it describes); return the card with ``weights`` set."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors, shared = _storable(state_dict)
    with atomic_path(out / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata=SAFETENSORS_METADATA)
    weights = {"file": WEIGHTS_FILE, "sha256": sha256_file(out / WEIGHTS_FILE)}
    if shared:
        weights["shared"] = shared
    card = {**card, "weights": weights}
    atomic_write_bytes(out / CARD_FILE, card_bytes(card))
    return card


def card_bytes(card: Mapping) -> bytes:
    """The card as written: sorted keys, fixed separators, one trailing newline, so the same card
    is the same bytes (and sha256) in every process."""
    return (json.dumps(card, indent=2, sort_keys=True, separators=(",", ": "), ensure_ascii=True) + "\n").encode()


def _storable(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Contiguous CPU tensors safetensors accepts, and ``{name: stored name}`` for tied weights.

    safetensors refuses tensors that share memory. A state dict has them when weights are tied
    (a language model's head is its embedding): the second name is stored as a reference to the
    first, and ``load_model`` hands the same tensor to both."""
    from training_runtime.checkpoint.weights import stored_and_shared

    stored, shared = stored_and_shared(state_dict)
    # clone: a slice of a bigger tensor (or a view a contiguous() leaves alone) must not share
    # storage with another entry, which safetensors would refuse.
    tensors = {name: t.to("cpu").contiguous().clone() for name, t in stored.items()}
    return tensors, shared


# --- loading ---------------------------------------------------------------------------------

def load_model(model_dir: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild and load the model in ``model_dir``: from its card, or (a directory written before
    cards) from ``weights.pt`` + ``resolved_config.json``."""
    model_dir = Path(model_dir)
    if (model_dir / CARD_FILE).is_file():
        return _load_carded(model_dir, torch.device(device))
    if (model_dir / LEGACY_WEIGHTS_FILE).is_file() and (model_dir / LEGACY_CONFIG_FILE).is_file():
        return _load_legacy(model_dir, torch.device(device))
    raise ModelCardError(f"{model_dir} holds neither {CARD_FILE} nor {LEGACY_WEIGHTS_FILE} + "
                         f"{LEGACY_CONFIG_FILE}; point at a trained model's output directory")


def read_card(model_dir: Path) -> dict:
    path = model_dir / CARD_FILE
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelCardError(f"{path} is not valid JSON ({exc}); the file is damaged, download it again") from exc
    if card.get("format") != CARD_FORMAT:
        raise ModelCardError(f"{path} has format {card.get('format')!r}, not {CARD_FORMAT!r}; it was written by "
                             "another version of the trainer")
    return card


def _load_carded(model_dir: Path, device: torch.device) -> LoadedModel:
    card = read_card(model_dir)
    weights = card.get("weights") or {}
    if not weights.get("file") or not weights.get("sha256"):
        raise ModelCardError(f"{model_dir / CARD_FILE} names no weights file and sha256; it was not written by "
                             "save_model")
    path = model_dir / weights["file"]
    if not path.is_file():
        raise ModelCardError(f"{path} does not exist; the card needs it beside {CARD_FILE}")
    actual = sha256_file(path)
    if actual != weights["sha256"]:
        raise ModelCardError(f"{path} has sha256 {actual}, but {CARD_FILE} says {weights['sha256']}: the weights "
                             "file is damaged or not the one this card describes; download the model again")
    state = load_file(str(path))
    for name, stored in (weights.get("shared") or {}).items():
        state[name] = state[stored]
    info = data_info_from_dict(card["data_info"])
    spec = card["model"]
    model = rebuild(spec["factory"], spec["input_shape"], spec["num_outputs"], spec["kwargs"],
                    spec.get("extra_kwargs") or {})
    _load_state(model, state, path)
    tokenizer_json = None
    tokenizer = card.get("tokenizer") or {}
    if tokenizer.get("file"):
        tok_path = model_dir / tokenizer["file"]
        if not tok_path.is_file():
            raise ModelCardError(f"{tok_path} does not exist; the card's {tokenizer.get('kind')} tokenizer needs it "
                                 f"beside {CARD_FILE}")
        tokenizer_json = tok_path.read_text()
    return LoadedModel(model=model.to(device).eval(), card=card, info=info, task=task_from_card(card["task"], info),
                       tokenizer_json=tokenizer_json)


def rebuild(factory: str, input_shape: list[int], num_outputs: int, kwargs: Mapping,
            extra_kwargs: Mapping) -> torch.nn.Module:
    clash = sorted(set(kwargs) & set(extra_kwargs))
    if clash:
        raise ModelCardError(f"the card gives model arguments {clash} twice (kwargs and extra_kwargs)")
    return build_model(factory, input_shape, num_outputs, **kwargs, **extra_kwargs)


def _load_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], path: Path) -> None:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelCardError(f"{path} does not fit the model its card describes: {exc}") from exc


def _load_legacy(model_dir: Path, device: torch.device) -> LoadedModel:
    """A v1 table classifier: the card is derived from the training config it was trained with."""
    resolved = json.loads((model_dir / LEGACY_CONFIG_FILE).read_text())
    manifest = resolved["data"]["manifest"]
    info = DataInfo.from_manifest(manifest)
    task = resolve_task("classification", info)
    weights_path = model_dir / LEGACY_WEIGHTS_FILE
    card = build_card(factory=resolved["model"]["name"], kwargs=resolved["model"].get("kwargs") or {},
                      input_shape=info.model_input_shape(), num_outputs=int(info.num_classes), extra_kwargs={},
                      task_card=task.card(), info=info, manifest=manifest,
                      training={"derived_from": LEGACY_CONFIG_FILE, "data_commit": resolved["data"].get("commit_id"),
                                "seed": resolved.get("train", {}).get("seed")})
    card["weights"] = {"file": LEGACY_WEIGHTS_FILE, "sha256": sha256_file(weights_path), "format": "torch.save"}
    model = rebuild(card["model"]["factory"], card["model"]["input_shape"], card["model"]["num_outputs"],
                    card["model"]["kwargs"], {})
    # weights_only: a pickle that holds anything but tensors is refused, not executed.
    _load_state(model, torch.load(weights_path, map_location="cpu", weights_only=True), weights_path)
    return LoadedModel(model=model.to(device).eval(), card=card, info=info, task=task)

