"""``reproduce``: retrain a version from its lineage record alone and compare the figures with the original."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from core.lineage import scalar_metrics
from core.registry import read_lineage, version_prefix, version_tag
from pipelines.cli.errors import ReproductionError
from pipelines.cli.render import format_reproduction
from pipelines.profiles import Profile

# The parts of the recorded config the training runtime reads (guards too: skipping non-finite
# batches changes the weights).
RUNTIME_KEYS = ("model", "data", "train", "checkpoint", "output_dir", "telemetry", "task", "train_fn", "validation",
                "guards")
# A version's weights: safetensors since model cards; weights.pt (a pickled state dict) before.
WEIGHT_FILES = ("model.safetensors", "weights.pt")


def reproduction_config(record: dict, manifest: dict, locations: dict[str, str], work_dir: Path) -> dict:
    """The runtime config of the original run, reading the same shards commit, writing to ``work_dir``."""
    resolved = record["training"]["config"]
    if resolved["data"]["commit_id"] != record["data"]["shards_commit"]:
        raise ValueError(f"the lineage record of v{record['version']} is inconsistent: its config read shards commit "
                         f"{resolved['data']['commit_id']} but it records {record['data']['shards_commit']}")
    config = {k: json.loads(json.dumps(resolved[k])) for k in RUNTIME_KEYS if k in resolved}
    config["data"].update(manifest=manifest, locations=locations, cache_dir=str(work_dir / "shard_cache"))
    config["data"].setdefault("sample_order", "global")  # what runs recorded before data.sample_order trained in
    config["checkpoint"]["dir"] = str(work_dir / "checkpoints")
    config["output_dir"] = str(work_dir / "output")
    return config


def code_warnings(version: int, original: dict, current: dict) -> list[str]:
    out = []
    if original.get("git_sha") != current.get("git_sha"):
        out.append(f"code differs: v{version} was trained at git {original.get('git_sha')}, this checkout is at "
                   f"{current.get('git_sha')}; differences may come from the code")
    if original.get("dirty"):
        out.append(f"v{version} was trained from a checkout with uncommitted changes; "
                   "its exact code cannot be recovered from git")
    if current.get("dirty"):
        out.append("this checkout has uncommitted changes")
    return out


def load_state(data: bytes, name: str) -> dict:
    """A state dict from a version's weights file (safetensors, or a legacy weights.pt)."""
    import io

    import torch

    if name.endswith(".safetensors"):
        from safetensors.torch import load

        return load(data)
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def max_weight_difference(a: dict, b: dict) -> float:
    """Largest absolute difference between two state dicts' tensors (inf if their shapes differ)."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return math.inf
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


def reproduction_rows(original: dict, repro: dict, tolerance: float,
                      exact: bool = False) -> list[tuple[str, object, object, bool | None]]:
    """(figure, original, reproduction, within tolerance); None marks a figure shown for information.

    Training with several ranks sums gradients in an order that can change between runs (NCCL on
    GPUs), so weights may differ in the last bits while every figure agrees; the weights rows say
    how much. With ``exact`` (the same machine and code: gloo on CPU is deterministic) the weights
    must be the same bytes: their sha256 and a zero difference are judged too.
    """
    pairs = [("final training loss", original["training_figures"].get("final_loss"), repro["final_loss"]),
             ("steps", original["training_figures"].get("steps"), repro["steps"])]
    for split in ("test", "validation"):  # every scalar metric the version recorded (they differ by task)
        for k, v in scalar_metrics(original["evaluation"][split]).items():
            pairs.append((f"{split} {k}", v, repro[split].get(k)))
    rows: list[tuple[str, object, object, bool | None]] = []
    for name, a, b in pairs:
        numeric = isinstance(a, (int, float)) and isinstance(b, (int, float))
        rows.append((name, a, b, math.isclose(a, b, rel_tol=0.0, abs_tol=tolerance) if numeric else a == b))
    rows.append(("weights sha256", original["checkpoint"]["sha256"], repro["weights_sha256"],
                 original["checkpoint"]["sha256"] == repro["weights_sha256"] if exact else None))
    rows.append(("max |weight difference|", 0.0, repro["max_weight_difference"],
                 repro["max_weight_difference"] == 0.0 if exact else None))
    return rows


def run_torchrun(config: dict, world_size: int, work_dir: Path, python_path: tuple[str, ...] = ()) -> Path:
    """Train with torchrun on this machine, as the local launcher does; return the output dir.
    ``python_path``: the folders the pipeline's code location imports its own code from."""
    from resources.launch.base import TrainingJob
    from resources.launch.local import torchrun_command, worker_python_path

    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = work_dir / "config.json"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    job = TrainingJob(name=work_dir.name, config=config, nproc_per_node=world_size, max_restarts=0)
    env = {**os.environ,
           "PYTHONPATH": worker_python_path(python_path),
           "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, world_size)))}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    log = work_dir / "torchrun.log"
    with log.open("w") as out:
        proc = subprocess.run(torchrun_command(job, config_path), cwd=work_dir, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise ReproductionError(f"training exited with status {proc.returncode}; its log is {log}")
    return Path(config["output_dir"])


def reproduce_command(args: argparse.Namespace) -> int:
    from core.code_version import code_version
    from core.pinned_shards import read_pinned_shards
    from training_runtime.serve.evaluate import evaluate

    from pipelines.cli.lookup import model_code, require_model

    profile = Profile.from_environment()
    store = profile.store()
    require_model(args, store)
    record = read_lineage(store, args.model, args.version)
    # A team's training function, task or model factory: imported as its code location imports it.
    python_path = model_code(args, args.model, record["training"]["config"])
    shards_commit = record["data"]["shards_commit"]
    manifest_path = record["data"]["manifest_path"]
    pinned = read_pinned_shards(store, shards_commit, manifest_path)
    manifest, locations, endpoint = pinned.manifest, pinned.locations, pinned.s3_endpoint_url
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work_dir = Path(args.work_dir or profile.data_root / "reproductions" / f"{args.model}-v{record['version']}-{stamp}")
    config = reproduction_config(record, manifest, locations, work_dir.resolve())
    for warning in code_warnings(record["version"], record["code"], code_version()):
        print(f"warning: {warning}", file=sys.stderr)
    world_size = int(record["training"]["world_size"])
    print(f"Reproducing {args.model} v{record['version']}: shards commit {shards_commit[:12]}, "
          f"seed {record['training']['seed']}, {world_size} rank(s), work dir {work_dir}", flush=True)
    output = run_torchrun(config, world_size, work_dir.resolve(), python_path)
    trained = json.loads((output / "metrics.json").read_text())
    tokenizer = manifest.get("tokenizer") or {}
    if tokenizer.get("kind") == "bpe":  # ships beside the shards; the card needs it to load the model
        shard_dir = manifest_path.rsplit("/", 1)[0] + "/"
        name = tokenizer.get("path", "tokenizer.json")
        store.download(shards_commit, shard_dir + name, output / name)
    weights = (output / WEIGHT_FILES[0]).read_bytes()
    tag, prefix = version_tag(args.model, record["version"]), version_prefix(args.model, record["version"])
    held = {o.path[len(prefix):] for o in store.list_objects(tag, prefix=prefix)}
    name = next((n for n in WEIGHT_FILES if n in held), None)
    if name is None:
        raise ReproductionError(f"{args.model} v{record['version']} holds no weights file ({' or '.join(WEIGHT_FILES)})")
    original_state = load_state(store.get_object(tag, prefix + name), name)
    repro = {"final_loss": trained["final_loss"], "steps": trained["steps"],
             "weights_sha256": hashlib.sha256(weights).hexdigest(),
             "max_weight_difference": max_weight_difference(original_state, load_state(weights, WEIGHT_FILES[0])),
             "test": evaluate(output, manifest, locations, split="test", s3_endpoint_url=endpoint),
             "validation": evaluate(output, manifest, locations, split="validation", s3_endpoint_url=endpoint)}
    rows = reproduction_rows(record, repro, args.tolerance, exact=getattr(args, "exact", False))
    print(format_reproduction(record, rows, args.tolerance))
    (work_dir / "reproduction.json").write_text(json.dumps(
        {"model": args.model, "version": record["version"], "original_run": record["dagster"]["run_id"],
         "figures": [{"figure": n, "original": a, "reproduction": b, "within_tolerance": ok} for n, a, b, ok in rows]},
        indent=2, sort_keys=True))
    differing = [n for n, _, _, ok in rows if ok is False]
    if differing:
        print(f"error: the reproduction differs from v{record['version']} in {', '.join(differing)} "
              f"(tolerance {args.tolerance:g})", file=sys.stderr)
        return 1
    same_bytes = ", and the weights are the same bytes (sha256 " + repro["weights_sha256"][:12] + ")" \
        if getattr(args, "exact", False) else ""
    print(f"Reproduced: every figure matches within {args.tolerance:g}{same_bytes}. Not registered as a new version; "
          f"the outputs stay in {work_dir}")
    return 0
