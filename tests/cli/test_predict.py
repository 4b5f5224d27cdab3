"""Serving a registered version: ``load_model`` + ``predict`` on a CSV give the model's own
predictions, and ``python -m pipelines predict`` prints them; a local store holds a version folder
written here (a model trained for a few steps on a tiny separable table, its card, its lineage)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.identity import os_actor
from core.registry import UnknownModelVersionError, lineage_path, move_alias, version_prefix, version_tag
from pipelines.cli import main
from pipelines.serving import PredictionInputError, load_model, predict
from resources.store.base import MAIN
from resources.store.factory import make_store
from tests.cli.records import make_record
from training_runtime.data.info import DataInfo
from training_runtime.serve.card import build_card, save_model
from training_runtime.models.builtin import build_model
from training_runtime.tasks.registry import resolve_task

CLASSES = ["circle", "square", "triangle"]
# Far from 0 and of different scales: a model fed unnormalised features would not get these right.
CENTRES = np.array([[1000.0, 50.0], [1010.0, 50.0], [1005.0, 60.0]])


def separable_table(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), n_per_class)
    return (CENTRES[labels] + rng.normal(scale=0.5, size=(len(labels), 2))).astype(np.float32), labels


def trained_mlp(features: np.ndarray, labels: np.ndarray, mean: np.ndarray, std: np.ndarray) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model("mlp", [2], 3, hidden_sizes=[16])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    x, y = torch.from_numpy((features - mean) / std), torch.from_numpy(labels)
    for _ in range(60):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval()


def register(store, model_name: str, version: int, files: dict[str, bytes], record: dict) -> None:
    """Commit a version folder on main and tag it, as core.versions.register_version leaves it."""
    prefix = version_prefix(model_name, version)
    for name, data in files.items():
        store.put_object(MAIN, prefix + name, data)
    store.put_object(MAIN, lineage_path(model_name, version), json.dumps(record).encode())
    commit = store.commit(MAIN, f"Register {model_name} v{version}", {})
    store.create_tag(version_tag(model_name, version), commit.id)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """DAGSTER_HOME with a store where model ``toy`` has v1 (a card) and v2 (weights.pt, from
    before cards); the trained model; a CSV of raw rows; and their true classes."""
    root = tmp_path_factory.mktemp("serving")
    home = root / "home"
    store = make_store("local", root=home / "platform" / "store", repository="model-factory")
    store.ensure_repository()
    features, labels = separable_table(20, seed=0)
    mean, std = features.mean(axis=0), features.std(axis=0)
    model = trained_mlp(features, labels, mean, std)
    manifest = {"format": "model-factory.shards/v1", "feature_shape": [2], "num_classes": 3,
                "class_names": CLASSES, "feature_columns": ["width", "height"],
                "normalisation": {"mean": mean.tolist(), "std": std.tolist()}}
    info = DataInfo.from_manifest(manifest)
    task = resolve_task("classification", info)
    card = build_card(factory="mlp", kwargs={"hidden_sizes": [16]}, input_shape=[2], num_outputs=3,
                      extra_kwargs={}, task_card=task.card(), info=info, manifest=manifest,
                      training={"steps": 60})
    out = root / "output"
    save_model(out, model.state_dict(), card)
    register(store, "toy", 1, {n: (out / n).read_bytes() for n in ("model_card.json", "model.safetensors")},
             make_record(1, model="toy"))
    legacy_manifest = {k: v for k, v in manifest.items() if k != "feature_columns"}
    resolved = {"model": {"name": "mlp", "kwargs": {"hidden_sizes": [16]}},
                "data": {"manifest": legacy_manifest, "commit_id": "2" * 64}, "train": {"seed": 0}}
    legacy = root / "weights.pt"
    torch.save(model.state_dict(), legacy)
    register(store, "toy", 2, {"weights.pt": legacy.read_bytes()},
             make_record(2, model="toy", **{"training.config": resolved}))
    test_x, test_y = separable_table(3, seed=1)
    csv = root / "rows.csv"
    # Columns in another order than the card's, and one the model does not read.
    csv.write_text("note,height,width\n" + "".join(f"r{i},{float(h)!r},{float(w)!r}\n"
                                                   for i, (w, h) in enumerate(test_x)))
    with torch.no_grad():
        own = model(torch.from_numpy((test_x - mean) / std)).softmax(dim=1).numpy()
    return {"home": home, "store": store, "csv": csv, "own": own, "truth": [CLASSES[i] for i in test_y],
            "root": root}


def test_predict_on_a_csv_reproduces_the_models_own_predictions(platform):
    loaded = load_model("toy", 1, store=platform["store"])
    rows = predict(loaded, str(platform["csv"]))
    own = platform["own"]
    assert [r["class"] for r in rows] == [CLASSES[i] for i in own.argmax(axis=1)] == platform["truth"]
    got = np.array([[r["probabilities"][c] for c in CLASSES] for r in rows])
    np.testing.assert_allclose(got, own, rtol=0, atol=1e-6)
    assert [r["probability"] for r in rows] == pytest.approx(own.max(axis=1).tolist(), abs=1e-6)
    assert loaded.source == {"model": "toy", "version": 1, "tag": "toy-v1"}


def test_a_version_from_before_model_cards_serves_the_same_predictions(platform):
    loaded = load_model("toy", 2, store=platform["store"])
    assert loaded.card["weights"]["file"] == "weights.pt"
    # No feature names were recorded then: the CSV's columns are read in order.
    csv = platform["root"] / "ordered.csv"
    rows = [line.split(",") for line in platform["csv"].read_text().splitlines()[1:]]
    csv.write_text("w,h\n" + "".join(f"{w},{h}\n" for _, h, w in rows))
    assert [r["class"] for r in predict(loaded, str(csv))] == platform["truth"]


def test_the_newest_version_is_the_default(platform):
    assert load_model("toy", store=platform["store"]).source["version"] == 2


def test_a_row_without_a_feature_column_fails_naming_it(platform):
    loaded = load_model("toy", 1, store=platform["store"])
    csv = platform["root"] / "no_height.csv"
    csv.write_text("width,depth\n1000,3\n")
    with pytest.raises(PredictionInputError, match="has no column 'height'"):
        predict(loaded, str(csv))
    csv.write_text("width,height\n1000,\n")
    with pytest.raises(PredictionInputError, match="line 2 has no value in column 'height'"):
        predict(loaded, str(csv))


def test_unknown_model_and_version_fail_clearly(platform):
    with pytest.raises(UnknownModelVersionError, match="model 'nope' has no registered versions"):
        load_model("nope", store=platform["store"])
    with pytest.raises(UnknownModelVersionError, match="has no version 7; registered versions: 1, 2"):
        load_model("toy", 7, store=platform["store"])


@pytest.fixture
def cli(platform, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(platform["home"]))
    monkeypatch.setenv("PLATFORM_PROFILE", "local")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_cli_prints_the_class_of_each_row(platform, cli):
    code, out, err = cli("predict", "toy", str(platform["csv"]), "--version", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "toy v1 (mlp, classification):"
    assert [line.split()[:3] for line in lines[1:]] == [["row", f"{i}:", c]
                                                        for i, c in enumerate(platform["truth"], start=1)]
    assert all("(p=" in line for line in lines[1:])


def test_cli_json_carries_the_probabilities(platform, cli):
    code, out, err = cli("predict", "toy", str(platform["csv"]), "--version", "v1", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["model"] == "toy" and answer["version"] == 1
    assert [p["class"] for p in answer["predictions"]] == platform["truth"]
    assert sorted(answer["predictions"][0]["probabilities"]) == CLASSES


def test_cli_alias_without_a_version_fails_then_follows_a_promotion(platform, cli):
    code, out, err = cli("predict", "toy", str(platform["csv"]), "--alias", "production")
    assert code == 2 and out == ""
    assert err.strip() == ("error: toy has no production version yet; promote one with "
                           "`python -m pipelines promote toy VERSION`, or ask for a version with --version")
    move_alias(platform["store"], "toy", "promote", os_actor(), version=1)
    code, out, err = cli("predict", "toy", str(platform["csv"]), "--alias", "production")
    assert code == 0, err
    assert out.splitlines()[0] == "toy v1 (mlp, classification):"


def test_cli_input_errors_are_one_line_with_status_2(platform, cli):
    code, out, err = cli("predict", "toy", str(Path(platform["root"]) / "missing.csv"), "--version", "1")
    assert code == 2 and "Traceback" not in err
    assert err.strip().startswith("error: ") and "missing.csv' is not a file" in err
    with pytest.raises(SystemExit) as refused:  # argparse refuses a version and an alias at once
        cli("predict", "toy", "x.csv", "--version", "1", "--alias", "production")
    assert refused.value.code == 2


# --- images and text, loaded from a model directory --------------------------------------------------

def saved_model(out: Path, factory: str, manifest: dict, kwargs: dict, extra: dict | None = None):
    """(LoadedModel, the model itself) for a fresh model on ``manifest``'s data, saved to ``out``."""
    from training_runtime.serve.card import load_model as load_model_dir

    info = DataInfo.from_manifest(manifest)
    task = resolve_task(info.task, info)
    torch.manual_seed(0)
    model = build_model(factory, info.model_input_shape(), task.num_outputs(), **kwargs, **(extra or {})).eval()
    card = build_card(factory=factory, kwargs=kwargs, input_shape=info.model_input_shape(),
                      num_outputs=task.num_outputs(), extra_kwargs=extra or {}, task_card=task.card(), info=info,
                      manifest=manifest, training={})
    save_model(out, model.state_dict(), card)
    return load_model_dir(out), model


def test_an_image_is_centre_cropped_and_normalised_as_the_shards_were(tmp_path):
    from PIL import Image

    manifest = {"format": "model-factory.shards/v2", "kind": "images", "task": "classification",
                "class_names": ["cat", "dog"], "num_classes": 2, "sample_shape": [8, 8, 3],
                "columns": [{"name": "image", "kind": "ndarray", "role": "input", "dtype": "uint8",
                             "shape": [8, 8, 3]},
                            {"name": "label", "kind": "ndarray", "role": "target", "dtype": "int64", "shape": []}],
                "preprocessing": {"kind": "image", "size": [8, 8], "fit": "center_crop", "channels": "RGB",
                                  "encoded": False, "jpeg_quality": 90, "function": None}}
    loaded, model = saved_model(tmp_path / "m", "resnet", manifest, {"widths": [4]})
    pixels = np.random.default_rng(0).integers(0, 256, (8, 16, 3), dtype=np.uint8)  # 16 wide, 8 high
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    [row] = predict(loaded, str(tmp_path / "wide.png"))
    middle = torch.from_numpy(pixels[:, 4:12].copy()).permute(2, 0, 1)[None].float()  # the centre 8x8
    with torch.no_grad():
        own = model((middle / 255 - 0.5) / 0.25).softmax(dim=1)[0]
    assert row["class"] == ["cat", "dog"][int(own.argmax())]
    assert [row["probabilities"]["cat"], row["probabilities"]["dog"]] == pytest.approx(own.tolist(), abs=1e-6)
    with pytest.raises(PredictionInputError, match="is not an image Pillow can read"):
        (tmp_path / "fake.png").write_text("not an image")
        predict(loaded, str(tmp_path / "fake.png"))


def test_a_text_classifier_reads_the_prompt_as_padded_byte_tokens(tmp_path):
    manifest = {"format": "model-factory.shards/v2", "kind": "text", "task": "classification",
                "class_names": ["neg", "pos"], "num_classes": 2,
                "columns": [{"name": "tokens", "kind": "ndarray", "role": "input", "dtype": "uint16", "shape": [8]},
                            {"name": "length", "kind": "ndarray", "role": "input", "dtype": "int32", "shape": []},
                            {"name": "label", "kind": "ndarray", "role": "target", "dtype": "int64", "shape": []}],
                "tokenizer": {"kind": "byte", "vocab_size": 258, "eos_id": 256, "pad_id": 257},
                "preprocessing": {"kind": "text", "tokenizer": "byte", "seq_len": 8, "function": None}}
    kwargs = {"d_model": 8, "nhead": 2, "num_layers": 1, "dim_feedforward": 16}
    loaded, model = saved_model(tmp_path / "m", "text_transformer", manifest, kwargs,
                                {"vocab_size": 258, "pad_id": 257})
    [short] = predict(loaded, "hi!")
    [long] = predict(loaded, "a longer text than eight bytes")
    expected = torch.tensor([[104, 105, 33, 257, 257, 257, 257, 257], list(b"a longer")])
    with torch.no_grad():
        own = model(expected).softmax(dim=1)
    for row, probs in zip((short, long), own):
        assert [row["probabilities"]["neg"], row["probabilities"]["pos"]] == pytest.approx(probs.tolist(), abs=1e-6)


def test_decoded_continuations_stop_at_the_end_of_text_token():
    from assets.kinds.text_tokens import BpeTokenizer, ByteTokenizer
    from pipelines.serving import decode_tokens

    assert decode_tokens(ByteTokenizer(), [104, 105, 256, 104, 105]) == "hi"
    assert decode_tokens(ByteTokenizer(), [0xC3]) == "\ufffd"  # half a character is shown, not dropped
    bpe = BpeTokenizer.train(["hello world", "hello there", "world hello"] * 3, vocab_size=270)
    ids = [int(i) for i in bpe.encode_batch(["hello world"])[0]]
    assert decode_tokens(bpe, ids + [bpe.eos_id] + ids) == "hello world"


def test_a_language_model_continues_the_prompt(tmp_path):
    pytest.importorskip("training_runtime.serve.generate", reason="training_runtime/serve/generate.py is not written yet")
    from training_runtime.serve.generate import generate

    manifest = {"format": "model-factory.shards/v2", "kind": "text", "task": "language_modeling",
                "columns": [{"name": "tokens", "kind": "ndarray", "role": "input", "dtype": "uint16", "shape": [13]}],
                "tokenizer": {"kind": "byte", "vocab_size": 258, "eos_id": 256, "pad_id": 257},
                "preprocessing": {"kind": "text", "tokenizer": "byte", "seq_len": 12, "function": None}}
    kwargs = {"d_model": 8, "nhead": 2, "num_layers": 1, "dim_feedforward": 16}
    loaded, model = saved_model(tmp_path / "m", "transformer_lm", manifest, kwargs, {"vocab_size": 258})
    [row] = predict(loaded, "ab", max_new_tokens=6, seed=3)
    [again] = predict(loaded, "ab", max_new_tokens=6, seed=3)
    assert row == again and row["prompt"] == "ab"
    new = generate(model, [97, 98], 6, max_len=12, seed=3, eos_id=256)
    cut = new[:new.index(256)] if 256 in new else new
    assert row["continuation"] == bytes(t for t in cut if t < 256).decode("utf-8", errors="replace")
