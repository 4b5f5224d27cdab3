"""Serve registered model versions: load one from the versioned store and predict on raw inputs.

``load_model`` fetches a version's folder (``models/<name>/versions/vN/``) at its tag and rebuilds
the model from its card. ``predict`` takes what a user has (a CSV file, an image file, a text
prompt) and turns it into model inputs exactly as the shards were made: table features
normalised with the training split's statistics, images converted and fitted by the sharding
code itself, text tokenized with the shipped tokenizer.
"""

from __future__ import annotations

import csv
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from core.registry import (
    PRODUCTION,
    AliasError,
    UnknownModelVersionError,
    read_alias,
    read_lineage,
    version_prefix,
    version_tag,
)
from resources.store.base import VersionedStore
from training_runtime.serve.card import CARD_FILE, LEGACY_CONFIG_FILE, LEGACY_WEIGHTS_FILE, LoadedModel, read_card
from training_runtime.serve.card import load_model as load_model_dir

CSV_BATCH_ROWS = 4096  # rows run through the model at a time


class PredictionInputError(ValueError):
    """An input the model cannot take (a missing file, a CSV without a feature column, ...)."""


# --- loading ---------------------------------------------------------------------------------

def load_model(name: str, version: int | None = None, alias: str | None = None, *,
               store: VersionedStore | None = None) -> LoadedModel:
    """Version ``version`` of model ``name``, or the version ``alias`` points at, or the newest.
    ``store`` defaults to the one the CLI uses (the platform profile's)."""
    if store is None:
        from pipelines.profiles import Profile  # deferred: it imports dagster

        store = Profile.from_environment().store()
    record = resolve_version(store, name, version, alias)
    v = record["version"]
    tag, prefix = version_tag(name, v), version_prefix(name, v)
    present = {o.path[len(prefix):] for o in store.list_objects(tag, prefix=prefix)}
    with tempfile.TemporaryDirectory(prefix=f"serve-{name}-v{v}-") as tmp:
        folder = Path(tmp)
        if CARD_FILE in present:
            store.download(tag, prefix + CARD_FILE, folder / CARD_FILE)
            card = read_card(folder)
            wanted = [card["weights"]["file"]] + ([card["tokenizer"]["file"]]
                                                 if (card.get("tokenizer") or {}).get("file") else [])
            for file in wanted:
                if file not in present:
                    raise UnknownModelVersionError(f"{name} v{v}'s card names {file}, but the version folder "
                                                   f"{prefix} at tag {tag} does not hold it")
                store.download(tag, prefix + file, folder / file)
        elif LEGACY_WEIGHTS_FILE in present:
            # Registered before model cards: the weights and the lineage record's training config.
            store.download(tag, prefix + LEGACY_WEIGHTS_FILE, folder / LEGACY_WEIGHTS_FILE)
            (folder / LEGACY_CONFIG_FILE).write_text(json.dumps(record["training"]["config"]))
        else:
            raise UnknownModelVersionError(f"{name} v{v} at tag {tag} holds neither {CARD_FILE} nor "
                                           f"{LEGACY_WEIGHTS_FILE} under {prefix}; it has no weights to serve")
        loaded = load_model_dir(folder)
    loaded.source = {"model": name, "version": v, "tag": tag}
    return loaded


def resolve_version(store: VersionedStore, name: str, version: int | None = None, alias: str | None = None) -> dict:
    """The lineage record of version ``version`` of ``name``, or of the version ``alias`` points
    at, or of the newest; one-line errors that say what exists."""
    if version is not None and alias is not None:
        raise ValueError(f"give a version or an alias of {name!r}, not both (got v{version} and {alias!r})")
    if alias is not None:
        read_lineage(store, name)  # an unknown model fails as such, before its alias does
        version = read_alias(store, name, alias)["version"]
        if version is None:
            hint = (f"promote one with `python -m pipelines promote {name} VERSION`" if alias == PRODUCTION
                    else f"point {alias!r} at a version first")
            raise AliasError(f"{name} has no {alias} version yet; {hint}, or ask for a version with --version")
    return read_lineage(store, name, version)


# --- predicting --------------------------------------------------------------------------------

def predict(loaded: LoadedModel, value: str, *, max_new_tokens: int = 40, seed: int = 0,
            temperature: float = 1.0, top_k: int | None = None) -> list[dict]:
    """Predictions for ``value``, one dict per input row: a CSV file's rows (table models), an
    image file (image models) or a text prompt (text models). Language models continue the prompt
    by sampling ``max_new_tokens`` tokens (``seed``, ``temperature``, ``top_k``)."""
    kind = loaded.info.kind
    if kind == "table":
        return _predict_rows(loaded, table_inputs(loaded, _existing_file(value, "a CSV file of feature rows")))
    if kind == "images":
        return _predict_rows(loaded, image_input(loaded, _existing_file(value, "an image file")))
    if kind == "text":
        if loaded.info.task == "language_modeling":
            return [continue_prompt(loaded, value, max_new_tokens=max_new_tokens, seed=seed,
                                    temperature=temperature, top_k=top_k)]
        return _predict_rows(loaded, text_input(loaded, value))
    raise PredictionInputError(f"the model card's input kind {kind!r} is none that predict reads "
                               "(table, images, text)")


def _existing_file(value: str, what: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise PredictionInputError(f"{value!r} is not a file; this model takes {what}")
    return path


@torch.no_grad()
def _predict_rows(loaded: LoadedModel, inputs: torch.Tensor) -> list[dict]:
    rows: list[dict] = []
    for start in range(0, inputs.shape[0], CSV_BATCH_ROWS):
        outputs = loaded.model(inputs[start:start + CSV_BATCH_ROWS])
        rows += format_predictions(loaded, loaded.task.predict(outputs))
    return rows


def format_predictions(loaded: LoadedModel, predicted: dict[str, np.ndarray]) -> list[dict]:
    """The task's arrays as one plain dict per row, classes and labels by name."""
    task = loaded.card["task"]["name"]
    names = _output_names(loaded)
    if task == "classification":
        return [{"class": names[int(i)], "probability": float(p[int(i)]),
                 "probabilities": dict(zip(names, map(float, p)))}
                for i, p in zip(predicted["class_index"], predicted["probabilities"])]
    if task == "multilabel":
        return [{"labels": [n for n, on in zip(names, labels) if on],
                 "probabilities": dict(zip(names, map(float, p)))}
                for labels, p in zip(predicted["labels"], predicted["probabilities"])]
    if task == "regression":
        values = np.asarray(predicted["value"], dtype=np.float64)
        if values.ndim == 1:
            return [{"value": float(v)} for v in values]
        if len(loaded.info.class_names) == values.shape[1]:
            return [{"value": dict(zip(loaded.info.class_names, map(float, row)))} for row in values]
        return [{"value": [float(x) for x in row]} for row in values]
    raise PredictionInputError(f"predict does not format {task!r} outputs; language models take a text prompt")


def _output_names(loaded: LoadedModel) -> list[str]:
    names = list(loaded.card.get("class_names") or [])
    count = loaded.card["model"]["num_outputs"]
    return names if len(names) == count else [str(i) for i in range(count)]


# --- tables -------------------------------------------------------------------------------------

def table_inputs(loaded: LoadedModel, path: Path) -> torch.Tensor:
    """The CSV's rows as model inputs: the card's feature columns (by name, in the card's order),
    normalised with the mean and std the shards were normalised with."""
    info = loaded.info
    width = math.prod(info.input_shape)
    columns = list(loaded.card["input"].get("feature_columns") or [])
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise PredictionInputError(f"{path} is empty; give a header row naming the feature columns and "
                                       "one row per sample")
        header = [h.strip() for h in header]
        if columns:
            missing = [c for c in columns if c not in header]
            if missing:
                raise PredictionInputError(f"{path} has no column {', '.join(map(repr, missing))}; the model reads "
                                           f"the feature columns {columns}")
        elif len(header) == width:
            columns = header  # a card without column names (v1 tables): the CSV's columns, in order
        else:
            raise PredictionInputError(f"the model's card names no feature columns, so {path} must hold exactly "
                                       f"its {width} features as columns, in training order; it has {len(header)}")
        index = [header.index(c) for c in columns]
        rows = [_feature_row(path, line, cells, header, index) for line, cells in enumerate(reader, start=2)
                if any(cell.strip() for cell in cells)]
    if not rows:
        raise PredictionInputError(f"{path} has a header but no rows to predict")
    if len(columns) != width:
        raise PredictionInputError(f"the card names {len(columns)} feature columns but the model reads {width} "
                                   "features; the card is inconsistent, re-register the model")
    features = np.asarray(rows, dtype=np.float32)
    if info.normalisation is not None:
        from assets.sharding import Normalisation  # the shards' own arithmetic, so inputs match bit for bit

        norm = Normalisation(mean=np.asarray(info.normalisation["mean"], dtype=np.float32),
                             std=np.asarray(info.normalisation["std"], dtype=np.float32))
        features = norm.apply(features)
    return info.to_model_input(torch.from_numpy(features.reshape(len(rows), *info.input_shape)))


def _feature_row(path: Path, line: int, cells: list[str], header: list[str], index: list[int]) -> list[float]:
    row = []
    for i in index:
        cell = cells[i].strip() if i < len(cells) else ""
        if not cell:
            raise PredictionInputError(f"{path} line {line} has no value in column {header[i]!r}")
        try:
            row.append(float(cell))
        except ValueError:
            raise PredictionInputError(f"{path} line {line}, column {header[i]!r}: {cell!r} is not a number") from None
    return row


# --- images -------------------------------------------------------------------------------------

def image_input(loaded: LoadedModel, path: Path) -> torch.Tensor:
    """The image as the model input of one sample: converted to the card's channels and fitted to
    its size by the sharding code (assets.kinds.image_decode), JPEG round trip included when the
    shards held JPEG bytes."""
    from PIL import Image

    from assets.kinds.image_decode import decode_jpeg, encode_jpeg, load_function, preprocess_pixels
    from core.spec import ImagePreprocessing

    recorded = loaded.card["input"].get("preprocessing")
    if not recorded:
        raise PredictionInputError("the model card records no image preprocessing (size, fit, channels); "
                                   "re-register the model with a card written from its shard manifest")
    prep = ImagePreprocessing(size=tuple(recorded["size"]), fit=recorded["fit"], channels=recorded["channels"],
                              encoded=bool(recorded.get("encoded")), jpeg_quality=int(recorded.get("jpeg_quality", 90)),
                              function=recorded.get("function"))
    function = load_function(prep.function) if prep.function else None
    try:
        pixels = preprocess_pixels(path.read_bytes(), prep, path.name, Image.MAX_IMAGE_PIXELS, function)
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise PredictionInputError(f"{path} is not an image Pillow can read: {type(exc).__name__}: {exc}") from exc
    if prep.encoded:
        pixels = decode_jpeg(encode_jpeg(pixels, prep.jpeg_quality), prep.channels).reshape(pixels.shape)
    if tuple(pixels.shape) != tuple(loaded.info.input_shape):
        raise PredictionInputError(f"{path} became pixels {list(pixels.shape)}, but the model reads "
                                   f"{list(loaded.info.input_shape)}; the card's preprocessing and data_info disagree")
    return loaded.info.to_model_input(torch.from_numpy(np.array(pixels))[None])  # a writable copy


# --- text ---------------------------------------------------------------------------------------

def tokenizer_of(loaded: LoadedModel):
    """The tokenizer the shards were made with: the byte tokenizer, or the shipped tokenizer.json."""
    from assets.kinds.text_tokens import BpeTokenizer, ByteTokenizer

    spec = loaded.card.get("tokenizer") or {}
    if spec.get("kind") == "byte":
        return ByteTokenizer()
    if spec.get("kind") == "bpe":
        if loaded.tokenizer_json is None:
            raise PredictionInputError("the model's BPE tokenizer.json was not loaded with it; its card names no "
                                       "tokenizer file")
        from tokenizers import Tokenizer

        return BpeTokenizer(Tokenizer.from_str(loaded.tokenizer_json))
    raise PredictionInputError(f"the model card's tokenizer {spec or None!r} is neither 'byte' nor 'bpe'; "
                               "a text model needs one to read a prompt")


def encode_text(loaded: LoadedModel, text: str) -> tuple[object, list[int]]:
    """(tokenizer, the token ids of ``text``), after the user's preprocessing function if the data had one."""
    from assets.kinds.text_tokens import apply_function, user_function
    from core.spec import TextPreprocessing

    tokenizer = tokenizer_of(loaded)
    recorded = loaded.card["input"].get("preprocessing") or {}
    if recorded.get("function"):
        prep = TextPreprocessing(tokenizer=tokenizer.kind, function=recorded["function"])
        text = apply_function(user_function(prep), [text], ["prompt"], prep.function)[0]
    return tokenizer, [int(i) for i in tokenizer.encode_batch([text])[0]]


def text_input(loaded: LoadedModel, text: str) -> torch.Tensor:
    """A document for a text classifier: its first seq_len tokens, padded as the shards were."""
    from assets.kinds.text_pack import classification_samples

    tokenizer, ids = encode_text(loaded, text)
    seq_len = loaded.info.input_shape[0]
    sample = classification_samples([np.asarray(ids, dtype=np.int64)], [0], ["prompt"], seq_len,
                                    tokenizer.pad_id, "int64")
    return loaded.info.to_model_input(torch.from_numpy(sample["tokens"]))


def continue_prompt(loaded: LoadedModel, prompt: str, *, max_new_tokens: int, seed: int, temperature: float,
                    top_k: int | None) -> dict:
    """A language model's sampled continuation of ``prompt``, decoded up to the end-of-text token."""
    from training_runtime.serve.generate import generate

    if max_new_tokens < 1:
        raise PredictionInputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    tokenizer, ids = encode_text(loaded, prompt)
    # An empty prompt starts a document: in the shards a document follows an end-of-text token.
    ids = ids or [tokenizer.eos_id]
    new = generate(loaded.model, ids, max_new_tokens, max_len=loaded.info.model_input_shape()[0],
                   temperature=temperature, top_k=top_k, seed=seed, eos_id=tokenizer.eos_id)
    return {"prompt": prompt, "continuation": decode_tokens(tokenizer, new)}


def decode_tokens(tokenizer, ids: list[int]) -> str:
    """Text of ``ids`` up to the first end-of-text token."""
    ids = [int(i) for i in ids]
    if tokenizer.eos_id in ids:
        ids = ids[:ids.index(tokenizer.eos_id)]
    if tokenizer.kind == "byte":
        # Sampled bytes need not form whole UTF-8 characters: a broken one shows as U+FFFD.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
    return tokenizer.decode([i for i in ids if i != tokenizer.pad_id])
