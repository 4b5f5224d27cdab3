"""``export``: write a model version's self-contained folder out of the store, for deployment.

A version's folder is ``models/<model>/versions/v<N>/`` at its tag ``<model>-v<N>``: the weights
(``model.safetensors``), the card (``model_card.json``: model, preprocessing, output), the tokenizer
of a text model (``tokenizer.json``), the ONNX export (``model.onnx``, when it passed its check)
and the lineage record (``lineage.json``). Each file is copied byte for byte, checked against the
sha256 the card and the record state, and a short ``README.md`` says how to load the folder with
safetensors or onnxruntime. Nothing is re-serialised, so the exported bytes hash as registered.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from core.lineage import version_folder
from core.registry import lineage_path, version_prefix, version_tag
from pipelines.cli.errors import UsageError
from resources.store.base import VersionedStore

README = "README.md"
WHAT = {"model.safetensors": "the weights (safetensors: a JSON header and raw tensors, no pickle)",
        "model_card.json": "the card: the model and its arguments, the task, the full preprocessing and the output",
        "tokenizer.json": "the tokenizer the text was encoded with (tokenizers library)",
        "model.onnx": "the model as ONNX, checked against PyTorch on test samples",
        "lineage.json": "the lineage record: the data, code, config, figures and checks that made this version",
        "weights.pt": "the weights of a version registered before model cards (a pickled state dict)"}


def export_command(args: argparse.Namespace) -> int:
    from pipelines.cli.lookup import require_model  # deferred: they import dagster
    from pipelines.profiles import Profile

    store = Profile.from_environment().store()
    require_model(args, store)
    files = export_version(store, args.model, Path(args.dir), version=args.version, alias=args.alias)
    width = max(map(len, files))
    print(f"Exported {args.model} to {args.dir}:")
    for name, digest in files.items():
        print(f"  {name:<{width}}  sha256 {digest}")
    return 0


def export_version(store: VersionedStore, model: str, out: Path, *, version: int | None = None,
                   alias: str | None = None) -> dict[str, str]:
    """Write the version's folder and its README into ``out`` (new or empty); return file -> sha256."""
    from pipelines.serving import resolve_version

    record = resolve_version(store, model, version, alias)
    v = record["version"]
    tag, prefix = version_tag(model, v), version_prefix(model, v)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty folder; export into a new or empty one")
    objects = sorted(o.path for o in store.list_objects(tag, prefix=prefix) if not o.path.endswith("/"))
    data = {path[len(prefix):]: store.get_object(tag, path) for path in objects}
    if "lineage.json" not in data:  # the record read above came from here: a store that changed under us
        raise UsageError(f"{model} v{v}: {lineage_path(model, v)} is missing at tag {tag}")
    check_files(model, v, data, json.loads(data["lineage.json"]))
    out.mkdir(parents=True, exist_ok=True)
    for name, content in data.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(content)
    (out / README).write_text(readme(json.loads(data["lineage.json"]), data, store.resolve_ref(tag)))
    return {name: hashlib.sha256(content).hexdigest() for name, content in data.items()}


def check_files(model: str, version: int, data: dict[str, bytes], record: dict) -> None:
    """The weights are the ones the card and the record name (by sha256), before anything is written."""
    card = json.loads(data["model_card.json"]) if "model_card.json" in data else None
    weights_name = (card or {}).get("weights", {}).get("file") or next(
        (n for n in ("model.safetensors", "weights.pt") if n in data), None)
    if weights_name is None or weights_name not in data:
        raise UsageError(f"{model} v{version} holds no weights file in its folder; it cannot be exported")
    digest = hashlib.sha256(data[weights_name]).hexdigest()
    claims = {"the record's checkpoint": record.get("checkpoint", {}).get("sha256")}
    if card is not None:
        claims["the card"] = card["weights"]["sha256"]
    wrong = [f"{who} says {claim[:12]}" for who, claim in claims.items() if claim and claim != digest]
    if wrong:
        raise UsageError(f"{model} v{version}: {weights_name} has sha256 {digest[:12]} but {', '.join(wrong)}; the "
                         "store's copy is damaged, nothing was exported")


def readme(record: dict, data: dict[str, bytes], commit_id: str) -> str:
    """The folder's README: what it is, where it came from, and how to load it."""
    model, v = record["model"], record["version"]
    folder = record.get("version_folder") or version_folder(model, v)
    card = json.loads(data["model_card.json"]) if "model_card.json" in data else {}
    d = record.get("data", {})
    lines = [f"# {model} v{v}", "",
             f"Exported from the model factory's store: `{folder['store_path']}` at tag `{folder['tag']}` "
             f"(commit `{commit_id}`). Trained on dataset {d.get('dataset_version') or d.get('dataset')} "
             f"(shards commit `{d.get('shards_commit')}`); `lineage.json` says everything else.", "",
             "| file | sha256 | what |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | `{hashlib.sha256(content).hexdigest()}` | {WHAT.get(name, '')} |"
              for name, content in sorted(data.items())]
    lines += ["", "## Load with safetensors (PyTorch)", "", "```python", "import json", "",
              "from safetensors.torch import load_file", "",
              'card = json.load(open("model_card.json"))', 'state = load_file("model.safetensors")',
              'for name, stored in (card["weights"].get("shared") or {}).items():',
              "    state[name] = state[stored]  # tied weights are stored once", "```", ""]
    spec = card.get("model") or {}
    if spec:
        lines += [f"The architecture is `{spec.get('factory')}` with arguments `{json.dumps(spec.get('kwargs'))}` "
                  f"(and `{json.dumps(spec.get('extra_kwargs'))}` derived from the data), input shape "
                  f"`{spec.get('input_shape')}`, {spec.get('num_outputs')} outputs. With the platform installed, "
                  "`training_runtime.serve.card.load_model(\".\")` rebuilds it and checks the weights' sha256.", ""]
    lines += _onnx_section(card, data, record)
    return "\n".join(lines) + "\n"


def _onnx_section(card: dict, data: dict[str, bytes], record: dict) -> list[str]:
    lines = ["## Run with onnxruntime", ""]
    if "model.onnx" not in data:
        onnx = (record.get("serving") or {}).get("onnx") or {}
        why = onnx.get("error") or ("it differed from PyTorch beyond its tolerance" if onnx.get("ok") else
                                    "this version was registered without an ONNX export")
        return lines + [f"This version has no `model.onnx`: {why}.", ""]
    prep, output = card.get("preprocessing"), card.get("output")
    lines += ["```python", "import numpy as np", "import onnxruntime as ort", "",
              'session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])',
              'outputs = session.run(None, {"input": x})[0]', "```", ""]
    if prep and output:
        model_input = prep.get("model_input") or {}
        # Image cards written before their model_input named a shape: the model's own input shape.
        shape = model_input.get("shape") or ["batch", *((card.get("model") or {}).get("input_shape") or [])]
        lines += [f"`x` is {json.dumps(shape)} {model_input.get('dtype')}, made from a raw "
                  f"{prep.get('kind')} input exactly as the card's `preprocessing` says, step by step. The output "
                  f"is {output.get('kind')}, {json.dumps(output.get('shape'))}; `predict` then does: "
                  f"{output.get('postprocessing')}.", ""]
    else:
        lines += ["This card predates its `preprocessing` and `output` sections: `input` in the card names the "
                  "input's shape, dtype and normalisation; the model returns what its task's `predict` reads "
                  "(logits for classification).", ""]
    return lines
