"""A model card is enough to serve from: preprocessing re-implemented from ``model_card.json`` alone
(numpy, Pillow, and the tokenizers library for a BPE tokenizer.json; nothing of the platform) and
``model.onnx`` run in onnxruntime give what ``pipelines.serving.predict`` gives, within 1e-5 on the
model's output scale, on non-square RGB, RGBA, palette and grayscale images (a JPEG decoded at
reduced size and an EXIF-rotated one among them), CSV rows, and a text prompt's tokens.

The output scale: probabilities as they are; a regression's values in target units, where the
model's output (in normalised units) is multiplied by the target's std, and so is the float32
difference between onnxruntime's and PyTorch's arithmetic (a few 1e-7): 1e-5 * std there.

Most models are untrained (random weights): preprocessing and post-processing are what is
compared, and a pixel off by one level moves these outputs by about 1e-4. The diabetes model is
trained, so that its values span the targets' range (25 to 346), where float32 would round them
by up to 1.5e-5."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image, ImageOps

TOLERANCE = 1e-5  # on the model's output scale: times the target's std for a regression in target units


def tolerance(card: dict) -> float:
    """TOLERANCE in the units ``predict`` reports: the card's target std for normalised regression."""
    norm = card["output"].get("target_normalisation")
    return TOLERANCE * float(np.max(norm["std"])) if norm else TOLERANCE


# --- the re-implementation: the card, numpy, Pillow (and tokenizers) only -------------------------
def card_of(folder: Path) -> dict:
    return json.loads((folder / "model_card.json").read_text())


def run_onnx(folder: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def crop_box(w: float, h: float, width: int, height: int) -> tuple[float, float, float, float]:
    """The card's crop_box formula."""
    if w * height > h * width:
        cw = h * width / height
        return ((w - cw) / 2, 0.0, (w + cw) / 2, float(h))
    ch = w * height / width
    return (0.0, (h - ch) / 2, float(w), (h + ch) / 2)


def image_input(card: dict, path: Path) -> np.ndarray:
    p = card["preprocessing"]
    assert p["size_order"] == "(height, width)" and p["function"] is None
    (height, width), mode, fit = p["size"], p["channels"], p["fit"]
    img = Image.open(path)
    orientation = img.getexif().get(0x0112, 1)
    turned = orientation in (5, 6, 7, 8)
    if img.format in ("JPEG", "MPO"):  # jpeg_draft
        sw, sh = img.size[::-1] if turned else img.size
        box = crop_box(sw, sh, width, height) if fit == "center_crop" else (0, 0, sw, sh)
        need = (math.ceil(sw * width / (box[2] - box[0])), math.ceil(sh * height / (box[3] - box[1])))
        img.draft(mode, need[::-1] if turned else need)
    if orientation != 1:
        img = ImageOps.exif_transpose(img)
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    if img.mode != mode:
        img = img.convert(mode)
    box = crop_box(*img.size, width, height) if fit == "center_crop" else None
    img = img.resize((width, height), Image.Resampling.BILINEAR, box=box)
    pixels = np.asarray(img, dtype=np.uint8).reshape(height, width, 1 if mode == "L" else 3)
    m = p["model_input"]
    assert m["order"] == "scale, then subtract mean, then divide by std"
    x = pixels.transpose(2, 0, 1)[None].astype(np.float32)
    return (x * np.float32(m["scale"]) - np.float32(m["mean"])) / np.float32(m["std"])


def table_input(card: dict, path: Path) -> np.ndarray:
    p = card["preprocessing"]
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.asarray([[float(r[c]) for c in p["columns"]] for r in rows], dtype=np.float32)
    norm = p["normalisation"]
    assert norm["order"] == "subtract mean, then divide by std"
    x = (x - np.asarray(norm["mean"], dtype=np.float32)) / np.asarray(norm["std"], dtype=np.float32)
    return x.reshape(len(rows), *p["model_input"]["shape"][1:])


def token_ids(card: dict, folder: Path, text: str) -> list[int]:
    tok = card["preprocessing"]["tokenizer"]
    if tok["kind"] == "byte":
        return list(text.encode("utf-8"))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / tok["file"]))
    tokenizer.encode_special_tokens = True  # "special_tokens_in_text": encoded as ordinary text
    return tokenizer.encode(text).ids


def softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def postprocess(card: dict, out: np.ndarray) -> np.ndarray:
    o = card["output"]
    if o["kind"] == "logits":
        return softmax(out)
    norm = o["target_normalisation"]
    values = out.reshape(len(out)) if o["shape"][1] == 1 else out
    return values.astype(np.float64) * norm["std"] + norm["mean"] if norm else values.astype(np.float64)


# --- models and inputs, made with the platform (setup only) ---------------------------------------
def model_folder(folder: Path, factory: str, manifest: dict, kwargs: dict, extra: dict | None = None,
                 tokenizer_file: Path | None = None) -> Path:
    from tests.runtime.test_model_card import trained_card
    from training_runtime.serve.card import load_model, save_model
    from training_runtime.serve.export import export_onnx

    model, card, info = trained_card(factory, manifest, kwargs, extra)
    save_model(folder, model.state_dict(), card)
    if tokenizer_file is not None:
        (folder / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    loaded = load_model(folder)
    shape = info.model_input_shape()
    example = torch.zeros((2, *shape), dtype=torch.long) if info.kind == "text" else torch.zeros((2, *shape))
    export_onnx(loaded.model, example, folder / "model.onnx")
    return folder


def _smooth(h: int, w: int, channels: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    planes = [127 + 120 * np.sin(x / rng.uniform(3, 9) + y / rng.uniform(3, 9) + rng.uniform(0, 6))
              for _ in range(channels)]
    return np.clip(np.stack(planes, axis=-1) + rng.normal(0, 6, (h, w, channels)), 0, 255).astype(np.uint8)


def write_images(root: Path) -> dict[str, Path]:
    rgb = Image.fromarray(_smooth(70, 50, 3, 1))  # 50 wide, 70 high
    files = {"rgb_png": root / "rgb.png", "rgba_png": root / "rgba.png", "palette_png": root / "palette.png",
             "palette_transparent_png": root / "palette_t.png", "grey_png": root / "grey.png",
             "large_jpeg": root / "large.jpg", "rotated_jpeg": root / "rotated.jpg"}
    rgb.save(files["rgb_png"])
    Image.fromarray(np.concatenate([_smooth(45, 61, 3, 2), _smooth(45, 61, 1, 3)], axis=-1), "RGBA").save(
        files["rgba_png"])
    rgb.quantize(24).save(files["palette_png"])
    palette = Image.fromarray(_smooth(53, 77, 3, 4)).quantize(16)
    palette.save(files["palette_transparent_png"], transparency=3)
    Image.fromarray(_smooth(80, 33, 1, 5)[:, :, 0], "L").save(files["grey_png"])
    Image.fromarray(_smooth(170, 300, 3, 6)).save(files["large_jpeg"], quality=92)  # drafted at 1/2 or less
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated by 90 degrees
    Image.fromarray(_smooth(130, 210, 3, 7)).save(files["rotated_jpeg"], quality=90, exif=exif)
    return files


IMAGE_PREP = {"kind": "image", "size": [24, 32], "fit": "center_crop", "encoded": False, "jpeg_quality": 90,
              "function": None}


def image_manifest(channels: str, fit: str = "center_crop") -> dict:
    c = 1 if channels == "L" else 3
    return {"format": "model-factory.shards/v2", "kind": "images", "task": "classification",
            "class_names": ["a", "b", "c"], "num_classes": 3, "sample_shape": [24, 32, c],
            "columns": [{"name": "image", "kind": "ndarray", "role": "input", "dtype": "uint8", "shape": [24, 32, c]},
                        {"name": "label", "kind": "ndarray", "role": "target", "dtype": "int64", "shape": []}],
            "preprocessing": {**IMAGE_PREP, "channels": channels, "fit": fit}}


# --- the comparisons --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    return write_images(tmp_path_factory.mktemp("images"))


@pytest.mark.parametrize("channels, fit", [("RGB", "center_crop"), ("L", "center_crop"), ("RGB", "resize")])
def test_images_from_the_card_alone_agree_with_predict(tmp_path, images, channels, fit):
    from pipelines.serving import predict
    from training_runtime.serve.card import load_model

    folder = model_folder(tmp_path, "mlp", image_manifest(channels, fit), {"hidden_sizes": [16]})
    card, loaded = card_of(folder), load_model(folder)
    assert card["output"]["kind"] == "logits" and card["output"]["names"] == ["a", "b", "c"]
    assert "normalisation" not in card["data_info"]  # no misleading null beside the real normalisation
    for name, path in images.items():
        ours = postprocess(card, run_onnx(folder, image_input(card, path)))[0]
        (served,) = predict(loaded, str(path))
        theirs = np.array([served["probabilities"][n] for n in card["output"]["names"]])
        assert np.max(np.abs(ours - theirs)) <= TOLERANCE, (name, ours, theirs)


TABLE = {"format": "model-factory.shards/v2", "kind": "table", "task": "regression",
         "feature_columns": ["age", "bmi", "bp"], "target_names": ["progression"],
         "columns": [{"name": "features", "kind": "ndarray", "role": "input", "dtype": "float32", "shape": [3]},
                     {"name": "target", "kind": "ndarray", "role": "target", "dtype": "float32", "shape": []}],
         "normalisation": {"mean": [50.0, 26.5, 94.0], "std": [13.0, 4.4, 13.8]},
         "target_normalisation": {"mean": 4.25, "std": 1.5}}


def test_csv_rows_from_the_card_alone_agree_with_predict(tmp_path):
    from pipelines.serving import predict
    from training_runtime.serve.card import load_model

    folder = model_folder(tmp_path / "m", "mlp", TABLE, {"hidden_sizes": [8]})
    rows = tmp_path / "rows.csv"
    rng = np.random.default_rng(0)
    with rows.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bp", "id", "age", "bmi"])  # other order, an extra column: read by name
        for i in range(7):
            w.writerow([f"{rng.normal(94, 14):.3f}", f"p{i}", f"{rng.normal(50, 13):.2f}", f"{rng.normal(26, 4):.4f}"])
    card, loaded = card_of(folder), load_model(folder)
    assert card["output"]["kind"] == "regression, normalised targets"
    ours = postprocess(card, run_onnx(folder, table_input(card, rows)))
    theirs = np.array([p["value"] for p in predict(loaded, str(rows))])
    assert np.max(np.abs(ours - theirs)) <= tolerance(card), (ours, theirs)


def diabetes_table() -> tuple[dict, np.ndarray, np.ndarray]:
    """(manifest, features, targets) of scikit-learn's bundled diabetes data, normalised as the
    shards normalise it (float64 statistics of the rows, features and targets alike)."""
    from pipelines.models.diabetes import FEATURES, TARGET, load_diabetes_frame

    frame = load_diabetes_frame()
    x, y = frame[list(FEATURES)].to_numpy(np.float64), frame[TARGET].to_numpy(np.float64)
    manifest = {"format": "model-factory.shards/v2", "kind": "table", "task": "regression",
                "feature_columns": list(FEATURES), "target_names": [TARGET],
                "columns": [{"name": "features", "kind": "ndarray", "role": "input", "dtype": "float32",
                             "shape": [len(FEATURES)]},
                            {"name": "target", "kind": "ndarray", "role": "target", "dtype": "float32", "shape": []}],
                "normalisation": {"mean": x.mean(0).tolist(), "std": x.std(0).tolist()},
                "target_normalisation": {"mean": float(y.mean()), "std": float(y.std())}}
    return manifest, x, y


def fitted_diabetes_folder(folder: Path) -> Path:
    """The diabetes MLP of pipelines/models/diabetes.py (hidden 32), fitted in this process on all
    rows until its values span the targets' range, saved with its card and exported to ONNX."""
    import tests.runtime.test_model_card as model_card

    manifest, x, y = diabetes_table()
    fresh = model_card.trained_card

    def fitted(*args, **kwargs):
        model, card, info = fresh(*args, **kwargs)
        norm, target = manifest["normalisation"], manifest["target_normalisation"]
        xs = torch.tensor((x - norm["mean"]) / np.asarray(norm["std"]), dtype=torch.float32)
        ys = torch.tensor((y - target["mean"]) / target["std"], dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
        model.train()
        for _ in range(400):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xs).squeeze(1), ys).backward()
            optimizer.step()
        return model.eval(), card, info

    model_card.trained_card = fitted
    try:
        return model_folder(folder, "mlp", manifest, {"hidden_sizes": [32]})
    finally:
        model_card.trained_card = fresh


def assert_diabetes_rows_agree(folder: Path, rows: Path) -> None:
    """Every row: predict's values are the card's float64 postprocessing of the PyTorch model's
    output, exactly; and a server that has only the card and model.onnx is within tolerance."""
    from pipelines.serving import predict
    from training_runtime.serve.card import load_model

    card, loaded = card_of(folder), load_model(folder)
    assert "float64" in card["output"]["postprocessing"]
    x = table_input(card, rows)
    served = predict(loaded, str(rows))
    assert len(served) == len(x) == 442
    theirs = np.array([p["value"] for p in served])
    with torch.no_grad():
        own = loaded.model(torch.from_numpy(x)).numpy()
    # What the card says predict does, done here with numpy: no float32 rounding on the way out.
    np.testing.assert_array_equal(theirs, postprocess(card, own))
    assert theirs.max() - theirs.min() > 150, "the model's values should span the targets' range"
    ours = postprocess(card, run_onnx(folder, x))
    worst = np.abs(ours - theirs)
    assert worst.max() <= tolerance(card), (int((worst > tolerance(card)).sum()), float(worst.max()))


def test_every_diabetes_row_from_the_card_alone_agrees_with_predict(tmp_path):
    from pipelines.models.diabetes import load_diabetes_frame

    folder = fitted_diabetes_folder(tmp_path / "m")
    rows = tmp_path / "patients.csv"
    load_diabetes_frame().to_csv(rows, index=False)  # every column of the source, the id and target among them
    assert_diabetes_rows_agree(folder, rows)


def text_manifest(task: str, seq: int, tokenizer: dict) -> dict:
    columns = [{"name": "tokens", "kind": "ndarray", "role": "input", "dtype": "uint16", "shape": [seq]}]
    if task == "classification":
        columns.append({"name": "label", "kind": "ndarray", "role": "target", "dtype": "int64", "shape": []})
    return {"format": "model-factory.shards/v2", "kind": "text", "task": task, "columns": columns,
            "tokenizer": tokenizer, "preprocessing": {"kind": "text", "tokenizer": tokenizer["kind"],
                                                      "seq_len": seq if task == "classification" else seq - 1,
                                                      "function": None},
            **({"class_names": ["no", "yes"], "num_classes": 2} if task == "classification" else {})}


def test_a_text_classifier_from_the_card_alone_agrees_with_predict(tmp_path):
    from pipelines.serving import encode_text, predict
    from training_runtime.serve.card import load_model

    byte = {"kind": "byte", "vocab_size": 258, "eos_id": 256, "pad_id": 257}
    folder = model_folder(tmp_path, "text_transformer", text_manifest("classification", 16, byte),
                          {"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32},
                          {"vocab_size": 258, "pad_id": 257})
    card, loaded = card_of(folder), load_model(folder)
    prompt = "Grüße, wine!"
    ids = token_ids(card, folder, prompt)
    assert ids == encode_text(loaded, prompt)[1]
    length = card["preprocessing"]["model_input"]["shape"][1]
    pad = card["preprocessing"]["tokenizer"]["pad_id"]
    x = np.asarray([(ids[:length] + [pad] * length)[:length]], dtype=np.int64)
    ours = postprocess(card, run_onnx(folder, x))[0]
    (served,) = predict(loaded, prompt)
    theirs = np.array([served["probabilities"][n] for n in card["output"]["names"]])
    assert np.max(np.abs(ours - theirs)) <= TOLERANCE


def test_a_language_models_prompt_tokens_and_next_token_from_the_card_alone(tmp_path):
    from assets.kinds.text_tokens import BpeTokenizer
    from pipelines.serving import encode_text
    from training_runtime.serve.card import load_model

    from pydoc_data.topics import topics

    bpe = BpeTokenizer.train(list(topics.values())[:20], 400)
    bpe.save(tmp_path / "tokenizer.json")
    folder = model_folder(tmp_path / "m", "transformer_lm", text_manifest("language_modeling", 13, bpe.describe()),
                          {"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32},
                          {"vocab_size": bpe.vocab_size}, tokenizer_file=tmp_path / "tokenizer.json")
    card, loaded = card_of(folder), load_model(folder)
    prompt = "The assert statement <|endoftext|> is a convenient way to insert debugging assertions"
    ids = token_ids(card, folder, prompt)
    assert ids == encode_text(loaded, prompt)[1] and len(ids) > card["preprocessing"]["context_length"]
    window = ids[-card["preprocessing"]["context_length"]:]
    ours = softmax(run_onnx(folder, np.asarray([window], dtype=np.int64))[:, -1])[0]
    with torch.no_grad():  # what predict samples the next token from, at temperature 1
        theirs = loaded.task.predict(loaded.model(torch.tensor([window])))["next_token_probabilities"][0]
    assert card["output"]["kind"] == "logits" and np.max(np.abs(ours - theirs)) <= TOLERANCE
