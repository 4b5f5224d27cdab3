"""The card's ``preprocessing`` and ``output`` sections: enough to serve a model from its card alone.

``preprocessing`` says how a raw input (a CSV row, an image file, a text) becomes the model's
input, step by step and exactly: what ``pipelines/serving.py`` ``predict`` does with the
platform's own code (which is the sharding code, so served inputs match the training samples).
``output`` says what the model (and ``model.onnx``, which computes the same function) returns
and what ``predict`` makes of it. tests/serving/test_card_alone.py re-implements both from a
card with numpy and Pillow only and agrees with ``predict``.

Image preprocessing is Pillow's: its calls are named with their arguments, so a re-implementation
with Pillow gets the same pixels. The crop box is fractional on purpose (the middle region of
exactly the target's aspect ratio); Pillow's ``resize(..., box=)`` takes such a box as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from training_runtime.data.info import IMAGE_MEAN, IMAGE_SCALE, IMAGE_STD, DataInfo

SERVING_FORMAT = "model-factory.serving/v1"  # of the two sections below; a card without them predates it

# How a crop box is computed and a JPEG decoded at reduced size (Pillow's DCT scaling): the
# formulas of assets/kinds/image_decode.py (crop_box, _draft_size), spelled out.
_CROP_BOX = ("box = (left, top, right, bottom) in pixels of the upright image of width w and height h, as "
             "floats: if w * H > h * W (wider than the target): cw = h * W / H, box = ((w - cw) / 2, 0, (w + cw) / 2, "
             "h); else ch = w * H / W, box = (0, (h - ch) / 2, w, (h + ch) / 2)")


def _draft(mode: str) -> str:
    return (f"JPEG files only, before anything else: img.draft({mode!r}, (dw, dh)), where (sw, sh) is img.size "
            "swapped when the EXIF orientation is 5, 6, 7 or 8 (the upright size), bw and bh the width and height "
            "of the crop box of (sw, sh) (the whole image for fit 'resize'), nw = ceil(sw * W / bw), "
            "nh = ceil(sh * H / bh), and (dw, dh) = (nw, nh), swapped back for orientations 5-8. Pillow then "
            f"decodes at the smallest DCT scale (1, 1/2, 1/4 or 1/8) that keeps at least that size, in {mode!r} "
            "when it can (a colour JPEG decodes straight to 'L')")


def preprocessing_section(info: DataInfo, manifest: Mapping, feature_columns: list | None) -> dict:
    """How a raw input becomes the model's input (``info`` and the shard ``manifest`` it came from)."""
    if info.kind == "images":
        return {"format": SERVING_FORMAT, **_image_steps(info, dict(manifest.get("preprocessing") or {}))}
    if info.kind == "text":
        return {"format": SERVING_FORMAT, **_text_steps(info, manifest)}
    return {"format": SERVING_FORMAT, **_table_steps(info, feature_columns)}


def _table_steps(info: DataInfo, feature_columns: list | None) -> dict:
    norm = info.normalisation
    return {
        "kind": "table",
        "columns": list(feature_columns) if feature_columns else None,
        "read": ("one row per sample: the feature columns by name, in the order of 'columns' (a card "
                 "without names: the input's columns in training order), each parsed as a number"),
        "dtype": "float32",
        "normalisation": None if norm is None else {
            "mean": list(norm["mean"]), "std": list(norm["std"]), "order": "subtract mean, then divide by std",
            "formula": "x = (x - mean) / std, per feature, in float32 (mean and std of the training split)"},
        "model_input": {"shape": ["batch", *info.model_input_shape()], "dtype": "float32",
                        "layout": "the row's features reshaped to the sample shape, C order"},
    }


def _image_steps(info: DataInfo, prep: dict) -> dict:
    height, width, channels = info.input_shape
    mode = prep.get("channels", "L" if channels == 1 else "RGB")
    steps: dict = {
        "kind": "images",
        "size": [int(height), int(width)], "size_order": "(height, width)", "channels": mode,
        "channel_order": "R, G, B" if mode == "RGB" else "L (one grey channel)",
        "library": "Pillow",
        "function": prep.get("function"),
    }
    if prep.get("function"):
        steps["decode"] = (f"PIL.Image.open, img.load(), then the user's {prep['function']} (PIL.Image -> uint8 "
                           f"array of shape (H, W, C)); that function defines everything up to the pixels")
    else:
        fit = prep.get("fit", "center_crop")
        steps.update(
            decode="img = PIL.Image.open(file)",
            jpeg_draft=_draft(mode),
            orientation="img = PIL.ImageOps.exif_transpose(img) when the EXIF orientation (tag 0x0112) is not 1",
            convert=("when img.mode is RGBA, LA or PA, or P with a transparency entry: img = img.convert('RGBA'), "
                     "then PIL.Image.alpha_composite(PIL.Image.new('RGBA', img.size, (255, 255, 255, 255)), img) "
                     f"(transparency over white); then img.convert({mode!r}) unless img.mode is already {mode!r}"),
            fit=fit,
            crop_box=_CROP_BOX if fit == "center_crop" else "none: the whole image is stretched to the size",
            resize=(f"img = img.resize(({width}, {height}), PIL.Image.Resampling.BILINEAR"
                    + (", box=box)" if fit == "center_crop" else ")")
                    + " (Pillow's bilinear filter widens with the reduction: antialiased)"))
    steps["pixels"] = f"numpy.asarray(img, dtype=uint8) reshaped to ({height}, {width}, {channels})"
    if prep.get("encoded"):
        steps["jpeg_round_trip"] = (f"the shards held JPEG bytes: encode the pixels with simplejpeg.encode_jpeg("
                                    f"quality={prep.get('jpeg_quality', 90)}, colorspace "
                                    + ("'GRAY', colorsubsampling 'Gray'" if mode == "L" else "'RGB', "
                                       "colorsubsampling '420'") + ") and decode them again (simplejpeg.decode_jpeg)")
    steps["model_input"] = {
        "shape": ["batch", *info.model_input_shape()],
        "layout": "NCHW: pixels (H, W, C) transposed to (C, H, W), a batch dimension in front", "dtype": "float32",
        "scale": IMAGE_SCALE, "mean": IMAGE_MEAN, "std": IMAGE_STD,
        "order": "scale, then subtract mean, then divide by std",
        "formula": "x = (float32(pixel) * scale - mean) / std, the same mean and std for every channel"}
    return steps


def _text_steps(info: DataInfo, manifest: Mapping) -> dict:
    prep = dict(manifest.get("preprocessing") or {})
    tok = dict(manifest.get("tokenizer") or {})
    lm = info.task == "language_modeling"
    if tok.get("kind") == "bpe":
        tokenizer = {"kind": "bpe", "file": "tokenizer.json", "library": tok.get("library", "tokenizers"),
                     "load": "tokenizers.Tokenizer.from_file('tokenizer.json')",
                     "special_tokens_in_text": ("encoded as ordinary text: set Tokenizer.encode_special_tokens = "
                                                "True before encoding; only the platform puts eos between documents"),
                     "encode": "Tokenizer.encode(text).ids (no special tokens added)"}
    else:
        tokenizer = {"kind": "byte", "encode": "the text's UTF-8 bytes as ids 0..255"}
    tokenizer.update(vocab_size=tok.get("vocab_size"), eos_id=tok.get("eos_id"), pad_id=tok.get("pad_id"),
                     eos_token=tok.get("eos_token"), pad_token=tok.get("pad_token"))
    steps = {"kind": "text", "function": prep.get("function"), "tokenizer": tokenizer,
             "before_tokenizing": (f"the user's {prep['function']} (str -> str) is applied to the text"
                                   if prep.get("function") else "nothing: the text is tokenized as it is")}
    length = int(info.input_shape[0])
    if lm:
        context = length - 1
        steps["context_length"] = context
        steps["model_input"] = {
            "dtype": "int64", "shape": ["batch", context],
            "tokens": (f"the prompt's token ids; an empty prompt is [eos_id]. predict feeds the last {context} "
                       f"tokens (or all, when fewer) to the PyTorch model; model.onnx takes exactly {context}")}
    else:
        steps["model_input"] = {
            "dtype": "int64", "shape": ["batch", length],
            "tokens": f"the first {length} token ids, then pad_id up to {length}"}
    return steps


def output_section(task_card: Mapping, info: DataInfo) -> dict:
    """What the model (and model.onnx) returns, and what ``predict`` makes of it."""
    name = task_card.get("name")
    if task_card.get("import_path"):
        return {"format": SERVING_FORMAT, "kind": f"defined by the task {task_card['import_path']}",
                "postprocessing": "that task's predict()"}
    if name == "classification":
        return {"format": SERVING_FORMAT, "kind": "logits", "shape": ["batch", task_card.get("num_classes")],
                "names": list(task_card.get("class_names") or info.class_names),
                "postprocessing": ("probabilities = softmax(logits, axis=-1) in float32; class = the name at "
                                   "argmax(probabilities)")}
    if name == "multilabel":
        return {"format": SERVING_FORMAT, "kind": "logits", "shape": ["batch", task_card.get("num_labels")],
                "names": list(task_card.get("label_names") or info.class_names),
                "threshold": task_card.get("threshold"),
                "postprocessing": "probabilities = sigmoid(logits); a label is on when its probability > threshold"}
    if name == "regression":
        norm = task_card.get("target_normalisation")
        return {"format": SERVING_FORMAT,
                "kind": "regression, normalised targets" if norm else "regression in target units",
                "shape": ["batch", task_card.get("num_outputs")],
                "names": list(task_card.get("target_names") or []), "target_normalisation": norm,
                "postprocessing": ("value = output * std + mean (float64), in target units" if norm
                                   else "value = output, already in target units")
                + "; a single target's [batch, 1] output is read as [batch]"}
    if name == "language_modeling":
        return {"format": SERVING_FORMAT, "kind": "logits", "shape": ["batch", "tokens", task_card.get("vocab_size")],
                "postprocessing": ("next-token probabilities = softmax(logits[:, -1]); predict samples a token from "
                                   "softmax(logits[:, -1] / temperature) (restricted to the top_k likeliest, seeded), "
                                   "appends it and repeats up to max_new_tokens or eos_id, then decodes the new "
                                   "tokens up to eos_id")}
    return {"format": SERVING_FORMAT, "kind": f"unknown task {name!r}", "postprocessing": None}
