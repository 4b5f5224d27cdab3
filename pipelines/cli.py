"""``python -m pipelines``: run the demo and question model versions from the command line."""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from core.registry import (
    PRODUCTION,
    AliasError,
    UnknownModelVersionError,
    add_comment,
    list_comments,
    list_versions,
    move_alias,
    read_alias,
    read_lineage,
    version_prefix,
    version_tag,
)
from pipelines.profiles import REPO_ROOT, Profile
from resources.store.base import RefNotFoundError, StoreError

DIFF_MARK = "*"


def _cmd_demo(args: argparse.Namespace) -> int:
    import dagster as dg

    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.models import PIPELINES
    from pipelines.models.digits import digits_pipeline, write_digits_source

    profile = Profile.from_environment()
    write_digits_source(profile.data_root / "sources")
    defs = build_definitions(profile, PIPELINES)
    job = defs.resolve_job_def(training_job_name(digits_pipeline))
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    if not result.success:
        for event in result.all_events:
            if event.is_failure:
                print(f"FAILED {event.step_key}: {event.event_specific_data.error.message.strip()}", file=sys.stderr)
        return 1
    print(f"Run {result.run_id} succeeded.\n")
    # The digits job also trains the models that share its shards (e.g. the YAML-declared CNN).
    models = sorted({e.asset_key.path[0] for e in result.get_asset_materialization_events()
                     if e.asset_key.path[-1] == "model_version"}, key=lambda m: (m != digits_pipeline.name, m))
    for i, model in enumerate(models):
        if i:
            print()
        _print_lineage(profile, model, None, as_json=False)
    return 0


# --- lineage -------------------------------------------------------------------------------------
def _cmd_lineage(args: argparse.Namespace) -> int:
    return _print_lineage(Profile.from_environment(), args.model, args.version, args.json)


def _print_lineage(profile: Profile, model: str, version: int | None, as_json: bool) -> int:
    store = profile.store()
    record = read_lineage(store, model, version)
    alias = read_alias(store, model)
    comments = list_comments(store, model, record["version"])
    if as_json:
        annotated = {**record, "annotations": {"comments": comments, PRODUCTION: alias}}
        print(json.dumps(annotated, indent=2, sort_keys=True))
        return 0
    from core.lineage import commit_ids  # imports torch: only where needed

    resolved = {name: _resolves(store, cid) for name, cid in commit_ids(record).items()}
    print(format_lineage(record, resolved, production=alias, comments=comments))
    return 0


def _resolves(store, commit_id: str) -> str | None:
    try:
        return store.resolve_ref(commit_id)
    except RefNotFoundError:
        return None


def format_lineage(record: dict, resolved: dict[str, str | None], production: dict | None = None,
                   comments: list[dict] = ()) -> str:
    t, ev = record["training"], record["evaluation"]
    lines = [
        f"{record['model']} v{record['version']}  (created {record['created_at']})",
        f"  checkpoint      {record['checkpoint']['uri']}",
        f"  sha256          {record['checkpoint']['sha256']}",
        f"  store           {record['data'].get('backend')} repository {record['data'].get('repository')}",
        f"  raw commit      {record['data']['raw_commit']}  (resolves: {'yes' if resolved.get('raw_commit') else 'no'})",
        f"  shards commit   {record['data']['shards_commit']}  (resolves: {'yes' if resolved.get('shards_commit') else 'no'})",
        f"  weights commit  {record['checkpoint']['commit']}",
        f"  code            git {record['code'].get('git_sha')} dirty={record['code'].get('dirty')}",
        f"  environment     python {record['environment']['python']}, torch {record['environment']['torch']}",
        f"  training        model={t['config'].get('model', {}).get('name')} seed={t['seed']} "
        f"world_size={t['world_size']} backend={t['backend']}",
        f"  figures         final_loss={record['training_figures'].get('final_loss')} "
        f"samples/s={record['training_figures'].get('samples_per_second')}",
        f"  test            accuracy={ev['test']['accuracy']:.4f} loss={ev['test']['loss']:.4f} "
        f"(n={ev['test']['num_samples']})",
        f"  quality gate    {'passed' if record['quality_gate']['passed'] else 'FAILED'}",
        f"  dagster run     {record['dagster']['run_id']}  {record['dagster']['run_url']}",
    ]
    for k, v in record.get("links", {}).items():
        lines.append(f"  lakeFS {k:<9} {v}")
    if production is not None:
        lines.append(f"  production      {format_production(production, record['version'])}")
    if comments:
        lines.append(f"  comments        {len(comments)}")
        lines.extend(f"    {c['created_at']}  {c['author']}: {c['text']}" for c in comments)
    return "\n".join(lines)


def format_production(alias: dict, version: int) -> str:
    current = alias.get("version")
    if current is None:
        return "no version is in production"
    last = alias["history"][-1]
    how = f"({last['action']} by {last['by']} at {last['at']})"
    if current == version:
        return f"this version, v{version}, is in production {how}"
    return f"v{current} is in production, not this version {how}"


# --- compare -------------------------------------------------------------------------------------
_SKIPPED_CONFIG = ("data.", "checkpoint.dir", "output_dir", "torch_version")


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts as dotted keys; lists stay values."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, object] = {}
    for k in sorted(value):
        out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
    return out


def parameters(record: dict) -> dict[str, object]:
    """The training parameters a version was trained with (not where its files were)."""
    flat = flatten(record["training"]["config"])
    return {k: v for k, v in flat.items() if not k.startswith(_SKIPPED_CONFIG)}


def metrics(record: dict) -> dict[str, object]:
    ev, fig = record["evaluation"], record["training_figures"]
    out: dict[str, object] = {}
    for split in ("test", "validation"):
        if split in ev:
            out[f"{split} accuracy"] = ev[split]["accuracy"]
            out[f"{split} loss"] = ev[split]["loss"]
            out[f"{split} samples"] = ev[split]["num_samples"]
    out["final training loss"] = fig.get("final_loss")
    out["steps"] = fig.get("steps")
    out["samples/s"] = fig.get("samples_per_second")
    out["quality gate"] = "passed" if record["quality_gate"]["passed"] else "FAILED"
    return out


def data_facts(record: dict) -> dict[str, object]:
    d = record["data"]
    out: dict[str, object] = {"dataset": d.get("dataset"), "raw commit": d["raw_commit"],
                              "shards commit": d["shards_commit"], "weights commit": record["checkpoint"]["commit"]}
    splits = record["training"]["config"].get("data", {}).get("manifest", {}).get("splits", {})
    for split, info in sorted(splits.items()):
        out[f"{split} split size"] = info.get("num_samples")
    out["code"] = f"{record['code'].get('git_sha')}{' (dirty)' if record['code'].get('dirty') else ''}"
    return out


SECTIONS = (("parameters", parameters), ("metrics", metrics), ("data and code", data_facts))


def compare_rows(records: list[dict]) -> list[tuple[str, str, list[object], bool]]:
    """(section, field, one value per record, differs) for every field any record has."""
    rows = []
    for section, extract in SECTIONS:
        values = [extract(r) for r in records]
        keys = list(dict.fromkeys(k for v in values for k in v))
        for key in keys:
            vals = [v.get(key, "—") for v in values]
            rows.append((section, key, vals, any(x != vals[0] for x in vals[1:])))
    return rows


def format_value(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a commit id or checksum: the prefix is enough to tell them apart
    if isinstance(value, (list, tuple)):
        return json.dumps(value)
    return str(value)


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    fmt = lambda cells: indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    rule = [("-" * w) if header[i] else " " * w for i, w in enumerate(widths)]
    return [fmt(header), fmt(rule), *(fmt(r) for r in rows)]


def format_compare(records: list[dict], only_differences: bool = False) -> str:
    rows = compare_rows(records)
    n_diff = sum(1 for r in rows if r[3])
    title = " vs ".join(f"v{r['version']}" for r in records)
    lines = [f"{records[0]['model']}: {title}   ({DIFF_MARK} marks {n_diff} field(s) that differ)"]
    for section, _ in SECTIONS:
        body = [[DIFF_MARK if d else "", key, *(format_value(v) for v in vals)]
                for s, key, vals, d in rows if s == section and (d or not only_differences)]
        lines.append("")
        lines.append(f"{section}:")
        if body:
            lines.extend(table(["", "field", *(f"v{r['version']}" for r in records)], body))
        else:
            lines.append("  (no differences)")
    return "\n".join(lines)


def _cmd_compare(args: argparse.Namespace) -> int:
    if len(args.versions) < 2:
        raise UsageError("compare needs at least two versions, e.g. `compare digits 1 2`")
    store = Profile.from_environment().store()
    records = [read_lineage(store, args.model, v) for v in args.versions]
    print(format_compare(records, only_differences=args.only_differences))
    return 0


# --- diff ----------------------------------------------------------------------------------------
def dataset_prefix(records: list[dict]) -> str:
    datasets = {r["data"].get("dataset") for r in records}
    return f"datasets/{datasets.pop()}/" if len(datasets) == 1 and None not in datasets else "datasets/"


def data_diff_rows(store, left: dict, right: dict) -> list[tuple[str, str, int | None, int | None]]:
    """(change, path, size in left, size in right) between two versions' dataset commits."""
    prefix = dataset_prefix([left, right])
    a, b = left["data"]["shards_commit"], right["data"]["shards_commit"]
    sizes_a = {o.path: o.size_bytes for o in store.list_objects(a, prefix=prefix)}
    sizes_b = {o.path: o.size_bytes for o in store.list_objects(b, prefix=prefix)}
    return [(e.type, e.path, sizes_a.get(e.path), sizes_b.get(e.path)) for e in store.diff(a, b, prefix=prefix)]


def format_diff(left: dict, right: dict, data_rows: list[tuple[str, str, int | None, int | None]]) -> str:
    model, v1, v2 = left["model"], f"v{left['version']}", f"v{right['version']}"
    prefix = dataset_prefix([left, right])
    lines = [f"{model}: {v1} -> {v2}", "",
             f"data ({prefix} at shards commit {left['data']['shards_commit'][:12]} -> "
             f"{right['data']['shards_commit'][:12]}):"]
    if data_rows:
        size = lambda n: "—" if n is None else f"{n:,} B"  # noqa: E731
        lines.extend(table(["change", "path", f"size {v1}", f"size {v2}"],
                           [[c, p, size(a), size(b)] for c, p, a, b in data_rows]))
        counts = {k: sum(1 for r in data_rows if r[0] == k) for k in ("added", "removed", "changed")}
        lines.append("  " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    else:
        lines.append("  (no objects differ: both versions were trained on the same data)")
    rows = compare_rows([left, right])
    for section, _ in SECTIONS[:2]:
        body = [[key, format_value(vals[0]), format_value(vals[1])] for s, key, vals, d in rows if s == section and d]
        lines += ["", f"{section}:"]
        lines.extend(table(["field", v1, v2], body) if body else ["  (no differences)"])
    return "\n".join(lines)


def _cmd_diff(args: argparse.Namespace) -> int:
    store = Profile.from_environment().store()
    left, right = read_lineage(store, args.model, args.v1), read_lineage(store, args.model, args.v2)
    print(format_diff(left, right, data_diff_rows(store, left, right)))
    return 0


# --- reproduce -----------------------------------------------------------------------------------
RUNTIME_KEYS = ("model", "data", "train", "checkpoint", "output_dir", "telemetry")


def reproduction_config(record: dict, manifest: dict, locations: dict[str, str], work_dir: Path) -> dict:
    """The runtime config of the original run, reading the same shards commit, writing to ``work_dir``."""
    resolved = record["training"]["config"]
    if resolved["data"]["commit_id"] != record["data"]["shards_commit"]:
        raise ValueError(f"the lineage record of v{record['version']} is inconsistent: its config read shards commit "
                         f"{resolved['data']['commit_id']} but it records {record['data']['shards_commit']}")
    config = {k: json.loads(json.dumps(resolved[k])) for k in RUNTIME_KEYS if k in resolved}
    config["data"].update(manifest=manifest, locations=locations, cache_dir=str(work_dir / "shard_cache"))
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


def max_weight_difference(original: bytes, reproduced: bytes) -> float:
    """Largest absolute difference between two state dicts' tensors (inf if their shapes differ)."""
    import io

    import torch

    a = torch.load(io.BytesIO(original), map_location="cpu", weights_only=True)
    b = torch.load(io.BytesIO(reproduced), map_location="cpu", weights_only=True)
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return math.inf
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


def reproduction_rows(original: dict, repro: dict, tolerance: float) -> list[tuple[str, object, object, bool | None]]:
    """(figure, original, reproduction, within tolerance); None marks a figure shown for information.

    Training with several ranks sums gradients in an order that can change between runs, so
    weights may differ in the last bits while every figure agrees; the weights rows say how much.
    """
    pairs = [("final training loss", original["training_figures"].get("final_loss"), repro["final_loss"]),
             ("steps", original["training_figures"].get("steps"), repro["steps"])]
    for split in ("test", "validation"):
        for k in ("accuracy", "loss"):
            pairs.append((f"{split} {k}", original["evaluation"][split][k], repro[split][k]))
    rows: list[tuple[str, object, object, bool | None]] = []
    for name, a, b in pairs:
        numeric = isinstance(a, (int, float)) and isinstance(b, (int, float))
        rows.append((name, a, b, math.isclose(a, b, rel_tol=0.0, abs_tol=tolerance) if numeric else a == b))
    rows.append(("weights sha256", original["checkpoint"]["sha256"], repro["weights_sha256"], None))
    rows.append(("max |weight difference|", 0.0, repro["max_weight_difference"], None))
    return rows


def format_reproduction(record: dict, rows: list[tuple[str, object, object, bool | None]], tolerance: float) -> str:
    body = []
    for name, a, b, ok in rows:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            delta = f"{b - a:+.3e}"
        else:
            delta = "identical" if a == b else "different"
        body.append([DIFF_MARK if ok is False else "", name, format_value(a), format_value(b), delta])
    lines = [f"{record['model']} v{record['version']}: original vs reproduction "
             f"({DIFF_MARK} marks a difference beyond {tolerance:g}; the weights rows are for information)"]
    lines.extend(table(["", "figure", "original", "reproduction", "difference"], body))
    return "\n".join(lines)


def run_torchrun(config: dict, world_size: int, work_dir: Path) -> Path:
    """Train with torchrun on this machine, as the local launcher does; return the output dir."""
    from resources.launch.base import TrainingJob
    from resources.launch.local import torchrun_command

    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = work_dir / "config.json"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    job = TrainingJob(name=work_dir.name, config=config, nproc_per_node=world_size, max_restarts=0)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p),
           "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, world_size)))}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    log = work_dir / "torchrun.log"
    with log.open("w") as out:
        proc = subprocess.run(torchrun_command(job, config_path), cwd=work_dir, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise ReproductionError(f"training exited with status {proc.returncode}; its log is {log}")
    return Path(config["output_dir"])


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from core.code_version import code_version
    from core.pinned_shards import read_pinned_shards
    from training_runtime.evaluate import evaluate

    profile = Profile.from_environment()
    store = profile.store()
    record = read_lineage(store, args.model, args.version)
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
    output = run_torchrun(config, world_size, work_dir.resolve())
    trained = json.loads((output / "metrics.json").read_text())
    weights = (output / "weights.pt").read_bytes()
    original_weights = store.get_object(version_tag(args.model, record["version"]),
                                        version_prefix(args.model, record["version"]) + "weights.pt")
    repro = {"final_loss": trained["final_loss"], "steps": trained["steps"],
             "weights_sha256": hashlib.sha256(weights).hexdigest(),
             "max_weight_difference": max_weight_difference(original_weights, weights),
             "test": evaluate(output, manifest, locations, split="test", s3_endpoint_url=endpoint),
             "validation": evaluate(output, manifest, locations, split="validation", s3_endpoint_url=endpoint)}
    rows = reproduction_rows(record, repro, args.tolerance)
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
    print(f"Reproduced: every figure matches within {args.tolerance:g}. Not registered as a new version; "
          f"the outputs stay in {work_dir}")
    return 0


# --- comment, promote, rollback ------------------------------------------------------------------
def _instance():
    """The Dagster instance at DAGSTER_HOME (the repository's dagster_home when unset, as `make` does)."""
    import dagster as dg

    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.from_config(str(REPO_ROOT / "dagster_home"))


def report_observation(model: str, description: str, metadata: dict) -> None:
    """Show an event in the history of ``<model>/model_version`` in the Dagster UI."""
    import dagster as dg

    with _instance() as instance:
        instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=dg.AssetKey([model, "model_version"]), description=description, metadata=metadata))


def _default_actor() -> str:
    return os.environ.get("USER") or getpass.getuser()


def _cmd_comment(args: argparse.Namespace) -> int:
    store = Profile.from_environment().store()
    note = add_comment(store, args.model, args.version, args.text, args.author)
    report_observation(args.model, f"Comment on v{args.version} by {note['author']}: {note['text']}", {
        "kind": "comment", "version": args.version, "comment": note["text"], "author": note["author"],
        "store_path": note["path"], "store_commit": note["commit_id"]})
    print(f"Recorded comment on {args.model} v{args.version} by {note['author']} "
          f"(store commit {note['commit_id'][:12]}, {note['path']}).")
    return 0


def _move(args: argparse.Namespace, action: str) -> int:
    store = Profile.from_environment().store()
    entry = move_alias(store, args.model, action, args.by, version=getattr(args, "version", None))
    before = "none" if entry["from"] is None else f"v{entry['from']}"
    report_observation(args.model, f"{action.capitalize()}: production {before} -> v{entry['to']} by {entry['by']}", {
        "kind": action, "production_version": entry["to"], "previous_production_version": before,
        "by": entry["by"], "store_commit": entry["commit_id"]})
    print(f"{args.model}: production {before} -> v{entry['to']} ({action} by {entry['by']} at {entry['at']}, "
          f"store commit {entry['commit_id'][:12]}).")
    return 0


def _cmd_versions(args: argparse.Namespace) -> int:
    store = Profile.from_environment().store()
    versions = list_versions(store, args.model)
    if not versions:
        read_lineage(store, args.model)  # raises the one-line "no registered versions" error
    alias = read_alias(store, args.model)
    rows = []
    for v in versions:
        r = read_lineage(store, args.model, v)
        rows.append(["production" if alias["version"] == v else "", f"v{v}", r["created_at"],
                     f"{r['evaluation']['test']['accuracy']:.4f}", r["data"]["shards_commit"][:12],
                     str(len(list_comments(store, args.model, v)))])
    print("\n".join(table(["alias", "version", "created", "test acc", "shards", "comments"], rows, indent="")))
    return 0


# --- parser --------------------------------------------------------------------------------------
class UsageError(ValueError):
    """Arguments that parse but make no sense together."""


class ReproductionError(RuntimeError):
    """The reproduction's training run failed."""


def version_number(text: str) -> int:
    """``3`` or ``v3``."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit() or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version number; write e.g. 3 or v3")
    return int(digits)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines",
        description="Run the demo and question model versions: their lineage, differences, reproduction, "
                    "comments and the production alias. The platform is the one at DAGSTER_HOME.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    def model_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="Model name, e.g. digits.")

    command("demo", "Run the digits job once on this profile and print the lineage of each version it registered.",
            _cmd_demo)

    p = command("lineage", "Print a model version's lineage record, its comments and the production alias.",
                _cmd_lineage)
    model_arg(p)
    p.add_argument("--version", type=version_number, default=None, help="Version number (default: the newest).")
    p.add_argument("--json", action="store_true", help="Print the record as JSON (comments and alias under 'annotations').")

    p = command("versions", "List a model's versions with test accuracy, data commit and the production alias.",
                _cmd_versions)
    model_arg(p)

    p = command("compare", "Show parameters, metrics and data commits of versions side by side; '*' marks differences.",
                _cmd_compare)
    model_arg(p)
    p.add_argument("versions", nargs="+", type=version_number, metavar="VERSION", help="Two or more versions, e.g. 1 2.")
    p.add_argument("--only-differences", action="store_true", help="Leave out fields that are the same everywhere.")

    p = command("diff", "Objects added, removed and changed between two versions' dataset commits, "
                        "plus their parameter and metric differences.", _cmd_diff)
    model_arg(p)
    p.add_argument("v1", type=version_number, help="The older version.")
    p.add_argument("v2", type=version_number, help="The newer version.")

    p = command("reproduce", "Re-run a version's training from its lineage record alone (same shards commit, config "
                             "and seed, torchrun on this machine) and compare the figures with the original.",
                _cmd_reproduce)
    model_arg(p)
    p.add_argument("version", type=version_number, help="The version to reproduce.")
    p.add_argument("--tolerance", type=float, default=1e-6,
                   help="Largest absolute difference of a figure counted as reproduced (default 1e-6).")
    p.add_argument("--work-dir", default=None, help="Where to train (default: <data root>/reproductions/...).")

    p = command("comment", "Record a note on a version: in the store, in `lineage` and in the asset's history in "
                           "the Dagster UI.", _cmd_comment)
    model_arg(p)
    p.add_argument("version", type=version_number, help="The version the note is about.")
    p.add_argument("text", help="The note.")
    p.add_argument("--author", default=_default_actor(), help="Who writes it (default: $USER).")

    p = command("promote", "Point the production alias at a version (audited).", lambda a: _move(a, "promote"))
    model_arg(p)
    p.add_argument("version", type=version_number, help="The version to put in production.")
    p.add_argument("--by", default=_default_actor(), help="Who promotes (default: $USER).")

    p = command("rollback", "Return the production alias to the version it pointed at before (audited).",
                lambda a: _move(a, "rollback"))
    model_arg(p)
    p.add_argument("--by", default=_default_actor(), help="Who rolls back (default: $USER).")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UnknownModelVersionError, AliasError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ReproductionError, StoreError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
