"""Model cards: a saved model loads back as the same function, from safetensors alone; a damaged
weights file is refused by name; directories from before cards (weights.pt) still load."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch

from training_runtime.data.info import DataInfo
from training_runtime.serve.card import CARD_FILE, WEIGHTS_FILE, ModelCardError, build_card, load_model, save_model
from training_runtime.models.builtin import build_model
from training_runtime.tasks.registry import resolve_task

V2 = "model-factory.shards/v2"
TABLE_MANIFEST = {"format": "model-factory.shards/v1", "feature_shape": [4], "num_classes": 3,
                  "class_names": ["circle", "square", "triangle"], "feature_columns": ["a", "b", "c", "d"],
                  "normalisation": {"mean": [0.5, 1.0, -1.0, 0.0], "std": [1.0, 2.0, 0.5, 1.0]}}
IMAGE_MANIFEST = {"format": V2, "kind": "images", "task": "classification", "class_names": ["cat", "dog"],
                  "num_classes": 2, "sample_shape": [8, 8, 3],
                  "columns": [{"name": "image", "kind": "ndarray", "role": "input", "dtype": "uint8",
                               "shape": [8, 8, 3]},
                              {"name": "label", "kind": "ndarray", "role": "target", "dtype": "int64", "shape": []}],
                  "preprocessing": {"kind": "image", "size": [8, 8], "fit": "center_crop", "channels": "RGB",
                                    "encoded": False, "jpeg_quality": 90, "function": None}}
LM_MANIFEST = {"format": V2, "kind": "text", "task": "language_modeling",
               "columns": [{"name": "tokens", "kind": "ndarray", "role": "input", "dtype": "uint16", "shape": [13]}],
               "tokenizer": {"kind": "byte", "vocab_size": 258, "eos_id": 256, "pad_id": 257},
               "preprocessing": {"kind": "text", "tokenizer": "byte", "seq_len": 12, "function": None}}


def trained_card(factory: str, manifest: dict, kwargs: dict, extra: dict | None = None):
    """(model, card) for a fresh model on ``manifest``'s data, as the trainer would write them."""
    info = DataInfo.from_manifest(manifest)
    task = resolve_task(info.task, info)
    torch.manual_seed(0)
    model = build_model(factory, info.model_input_shape(), task.num_outputs(), **kwargs, **(extra or {}))
    card = build_card(factory=factory, kwargs=kwargs, input_shape=info.model_input_shape(),
                      num_outputs=task.num_outputs(), extra_kwargs=extra or {}, task_card=task.card(), info=info,
                      manifest=manifest, training={"steps": 0, "data_commit": "c" * 64})
    return model.eval(), card, info


def test_table_mlp_round_trip_gives_identical_outputs(tmp_path):
    model, card, info = trained_card("mlp", TABLE_MANIFEST, {"hidden_sizes": [8]})
    written = save_model(tmp_path, model.state_dict(), card)
    loaded = load_model(tmp_path)
    x = torch.randn(5, 4)
    assert torch.equal(loaded.model(x), model(x))
    assert not loaded.model.training
    assert loaded.info == info
    assert loaded.task.name == "classification"
    on_disk = json.loads((tmp_path / CARD_FILE).read_text())
    assert on_disk == written == loaded.card
    assert on_disk["weights"]["file"] == WEIGHTS_FILE and len(on_disk["weights"]["sha256"]) == 64
    assert on_disk["input"]["feature_columns"] == ["a", "b", "c", "d"]
    assert on_disk["input"]["normalisation"] == TABLE_MANIFEST["normalisation"]
    assert on_disk["class_names"] == ["circle", "square", "triangle"]
    assert on_disk["model"] == {"factory": "mlp", "kwargs": {"hidden_sizes": [8]}, "input_shape": [4],
                                "num_outputs": 3, "extra_kwargs": {}}


def test_resnet_round_trip_keeps_batchnorm_statistics(tmp_path):
    model, card, _ = trained_card("resnet", IMAGE_MANIFEST, {"widths": [4, 8]})
    model.train()
    with torch.no_grad():
        model(torch.randn(6, 3, 8, 8) * 3 + 1)  # moves the running statistics away from their start
    model.eval()
    save_model(tmp_path, model.state_dict(), card)
    loaded = load_model(tmp_path)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(loaded.model(x), model(x))
    assert loaded.card["input"]["preprocessing"]["size"] == [8, 8]
    assert loaded.info.kind == "images" and loaded.info.input_shape == (8, 8, 3)


def test_language_model_with_tied_weights_round_trip(tmp_path):
    kwargs = {"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32}
    model, card, _ = trained_card("transformer_lm", LM_MANIFEST, kwargs, {"vocab_size": 258})
    card = save_model(tmp_path, model.state_dict(), card)
    assert card["weights"]["shared"] == {"head.weight": "encoder.embed.weight"}
    assert card["tokenizer"] == {"kind": "byte", "vocab_size": 258, "eos_id": 256, "pad_id": 257, "file": None}
    loaded = load_model(tmp_path)
    assert loaded.model.head.weight is loaded.model.encoder.embed.weight  # still tied after loading
    tokens = torch.randint(0, 258, (2, 12))
    assert torch.equal(loaded.model(tokens), model(tokens))
    assert loaded.task.name == "language_modeling"


def test_weights_file_holds_only_a_json_header_and_raw_tensors(tmp_path):
    model, card, _ = trained_card("mlp", TABLE_MANIFEST, {"hidden_sizes": [8]})
    save_model(tmp_path, model.state_dict(), card)
    data = (tmp_path / WEIGHTS_FILE).read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert sorted(tensors) == sorted(model.state_dict())
    payload = sum(4 * math.prod(t["shape"]) for t in tensors.values())  # all float32
    assert len(data) == 8 + header_len + payload  # nothing else: no pickle anywhere
    assert b"\x80\x02" not in data[:2] and b"torch" not in data[8 + header_len:]


def test_damaged_weights_are_refused_naming_the_file(tmp_path):
    model, card, _ = trained_card("mlp", TABLE_MANIFEST, {"hidden_sizes": [8]})
    save_model(tmp_path, model.state_dict(), card)
    path = tmp_path / WEIGHTS_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelCardError, match=rf"{path}.*sha256.*damaged"):
        load_model(tmp_path)


def test_a_card_that_does_not_fit_the_weights_is_refused(tmp_path):
    model, card, _ = trained_card("mlp", TABLE_MANIFEST, {"hidden_sizes": [8]})
    card = save_model(tmp_path, model.state_dict(), card)
    card["model"]["kwargs"] = {"hidden_sizes": [16]}
    (tmp_path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ModelCardError, match=rf"{tmp_path / WEIGHTS_FILE} does not fit the model"):
        load_model(tmp_path)


def test_a_bpe_card_needs_its_tokenizer_file(tmp_path):
    manifest = {**LM_MANIFEST, "tokenizer": {"kind": "bpe", "vocab_size": 300, "eos_id": 0, "pad_id": 1}}
    kwargs = {"d_model": 8, "nhead": 2, "num_layers": 1, "dim_feedforward": 16}
    model, card, _ = trained_card("transformer_lm", manifest, kwargs, {"vocab_size": 300})
    save_model(tmp_path, model.state_dict(), card)
    with pytest.raises(ModelCardError, match="tokenizer.json does not exist"):
        load_model(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": "stand-in"}')
    assert load_model(tmp_path).tokenizer_json == '{"model": "stand-in"}'


def test_legacy_weights_pt_directory_loads_with_a_derived_card(tmp_path):
    torch.manual_seed(0)
    model = build_model("mlp", [4], 3, hidden_sizes=[8]).eval()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    manifest = {k: v for k, v in TABLE_MANIFEST.items() if k != "feature_columns"}
    resolved = {"model": {"name": "mlp", "kwargs": {"hidden_sizes": [8]}},
                "data": {"manifest": manifest, "commit_id": "2" * 64}, "train": {"seed": 0}}
    (tmp_path / "resolved_config.json").write_text(json.dumps(resolved))
    loaded = load_model(tmp_path)
    x = torch.randn(3, 4)
    assert torch.equal(loaded.model(x), model(x))
    assert loaded.card["task"]["name"] == "classification"
    assert loaded.card["weights"]["file"] == "weights.pt"
    assert loaded.card["class_names"] == ["circle", "square", "triangle"]
    assert loaded.info == DataInfo.from_manifest(manifest)


def test_a_directory_without_a_model_says_what_it_needs(tmp_path):
    with pytest.raises(ModelCardError, match="holds neither model_card.json nor weights.pt"):
        load_model(tmp_path)
