"""The ``predict`` command: load a registered model version and predict on a CSV file, an image
or a text prompt, as readable lines or as JSON."""

from __future__ import annotations

import argparse
import json

from pipelines.cli.errors import UsageError


def predict_command(args: argparse.Namespace) -> int:
    # Deferred: serving imports torch (seconds), which the other commands do not need.
    from core.registry import read_lineage
    from pipelines.cli.lookup import model_code, require_model
    from pipelines.profiles import Profile
    from pipelines.serving import PredictionInputError, load_model, predict

    store = Profile.from_environment().store()
    require_model(args, store)
    # A card naming the team's model factory or task imports it from where its location does.
    model_code(args, args.model, read_lineage(store, args.model, args.version)["training"]["config"])
    loaded = load_model(args.model, version=args.version, alias=args.alias, store=store)
    try:
        rows = predict(loaded, args.input, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       temperature=args.temperature, top_k=args.top_k)
    except PredictionInputError as exc:
        raise UsageError(str(exc)) from exc  # a wrong request: exit status 2, like a wrong argument
    version = loaded.source["version"]
    if args.json:
        print(json.dumps({"model": args.model, "version": version, "input": args.input, "predictions": rows},
                         indent=2, sort_keys=True))
        return 0
    task = loaded.card["task"]["name"]
    print(f"{args.model} v{version} ({loaded.card['model']['factory']}, {task}):")
    for i, row in enumerate(rows, start=1):
        text = format_prediction(row)
        print(f"row {i}: {text}" if len(rows) > 1 else text)
    return 0


def format_prediction(row: dict) -> str:
    """One prediction as a line: the class and its probability, the value, the labels, or the text."""
    if "class" in row:
        return f"{row['class']} (p={row['probability']:.3f})"
    if "continuation" in row:
        return f"{row['prompt']}{row['continuation']}"
    if "labels" in row:
        on = ", ".join(row["labels"]) or "(no label)"
        probs = ", ".join(f"{name} {p:.3f}" for name, p in row["probabilities"].items())
        return f"{on} (p: {probs})"
    value = row["value"]
    if isinstance(value, dict):
        return ", ".join(f"{name}={v:.6g}" for name, v in value.items())
    if isinstance(value, list):
        return ", ".join(f"{v:.6g}" for v in value)
    return f"{value:.6g}"
