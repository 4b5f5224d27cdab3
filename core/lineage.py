"""The lineage record of a model version: everything needed to know, and redo, what produced it."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import NamedTuple

from core.code_version import code_version
from core.registry import version_prefix, version_tag
from core.experiment_lineage import experiment_fields, experiment_rows


def build_lineage_record(
    *, model: str, version: int, checkpoint: dict, shards: dict, raw: dict, store_facts: dict[str, str],
    resolved_config: dict, metrics: dict, evaluation: dict, gate: dict, run_id: str, run_url: str,
    links: dict[str, str] | None = None, checks: dict | None = None, dataset_version: str | None = None,
    serving: dict | None = None,
) -> dict:
    """``serving``: the version's files (weights, card, tokenizer, ONNX), the ONNX export's check
    and, for language models, sampled continuations."""
    import torch  # deferred: loading definitions must not import torch

    train = resolved_config.get("train", {})
    return {
        "model": model,
        "version": version,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": {
            "uri": checkpoint["weights_uri"],
            "sha256": checkpoint["weights_sha256"],
            "store_path": checkpoint["weights_path"],
            "commit": checkpoint["commit_id"],
            # The run's TensorBoard event files beside the weights (ops/tensorboard_events.py);
            # None for runs that wrote none.
            "tensorboard_path": checkpoint.get("tensorboard_path"),
            "tensorboard_uri": checkpoint.get("tensorboard_uri"),
        },
        "data": {
            **store_facts,
            "dataset": shards["dataset"],
            "raw_commit": raw["commit_id"],
            "shards_commit": shards["commit_id"],
            "manifest_path": shards["manifest_path"],
            # The published dataset version (tag "<dataset>-d<N>", core.datasets) the shards belong to.
            "dataset_version": dataset_version,
            # The code location that published the dataset (another team's, for a shared dataset).
            "location": shards.get("location"),
        },
        "code": code_version(),
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()},
        # What the training processes reported about themselves (training_runtime/observe/pod_lineage.py):
        # image and digest, the image's build, torch/CUDA/NCCL, GPU models and nodes. None for
        # trainings whose runtime predates it.
        "pod": resolved_config.get("pod"),
        "training": {
            "config": resolved_config,
            "seed": train.get("seed"),
            "world_size": resolved_config.get("world_size", metrics.get("world_size")),
            "backend": resolved_config.get("backend", metrics.get("backend")),
            # The artifact folder of every rank's output (ops/rank_logs.py); older checkpoints have none.
            "logs": checkpoint.get("logs_uri"),
            # What the runtime's guards detected (training_runtime/observe/guards.py): NaN, spikes, stragglers ...
            "detections": list(metrics.get("detections") or []),
            # How the training got there: every attempt (torchrun restarts, Dagster retries) when the
            # runtime records them, else the last attempt's restart count (its resumed_from_step is
            # in training_figures).
            "attempts": metrics.get("attempts"),
            "restart_count": metrics.get("restart_count"),
            # An elastic gang's resizes (training_runtime/distributed/elastic.py): when, from what
            # world size to what, and why; empty for a gang that kept its size.
            "resizes": list(metrics.get("resizes") or []),
            "nonfinite_skipped": metrics.get("nonfinite_skipped", 0),
        },
        "task": resolved_config.get("task", "classification"),
        # The run's overrides of its pipeline and the sweep it is the best trial of (core/experiment_lineage.py).
        **experiment_fields(checkpoint),
        "training_figures": {k: metrics.get(k) for k in
                             ("final_loss", "samples_per_second", "data_wait_share", "steps", "epochs",
                              "checkpoint_stall_s_total", "resumed_from_step", "monitor", "best_step",
                              "best_value", "weights_from_step", "stopped_early")},
        "serving": serving or {},
        # Where the version's whole folder is (weights, card, tokenizer, ONNX, this record):
        # `python -m pipelines export` writes it out. The checkpoint above is only the weights' copy.
        "version_folder": version_folder(model, version),
        "evaluation": evaluation,
        "quality_gate": gate,
        "checks": checks or {},
        "dagster": {"run_id": run_id, "run_url": run_url},
        "links": links or {},
    }


def version_folder(model: str, version: int) -> dict[str, str]:
    """The store folder holding everything a version serves from, and the tag to read it at."""
    return {"store_path": version_prefix(model, version), "tag": version_tag(model, version),
            "export": f"python -m pipelines export {model} --version {version} DIR"}


def lineage_bytes(record: Mapping) -> bytes:
    """The record's canonical form, the bytes ``lineage.json`` holds: sorted keys, fixed
    separators, ASCII, one trailing newline. The same record is the same bytes in any process,
    whatever order its dicts were filled in, so its sha256 names its content."""
    return (json.dumps(record, indent=2, sort_keys=True, separators=(",", ": "), ensure_ascii=True) + "\n").encode()


def lineage_sha256(data: bytes) -> str:
    """sha256 of the bytes written (never of a re-serialisation, which could differ)."""
    return hashlib.sha256(data).hexdigest()


def commit_ids(record: dict) -> dict[str, str]:
    """The store commits a record points at (each must resolve in the store)."""
    return {
        "raw_commit": record["data"]["raw_commit"],
        "shards_commit": record["data"]["shards_commit"],
        "checkpoint_commit": record["checkpoint"]["commit"],
        **({"version_commit": record["version_commit"]} if record.get("version_commit") else {}),
    }


# --- showing a record: the CLI's `lineage` text and the UI's Markdown render the same rows ----------
class LineageRow(NamedTuple):
    """One fact of a lineage record. ``url`` is where the value can be looked at: the terminal
    prints it beside the value, Markdown makes the value a link to it."""

    field: str
    value: str
    url: str | None = None


def lineage_heading(record: dict) -> str:
    return f"{record['model']} v{record['version']}  (created {record['created_at']})"


def detections_summary(detections: list[dict]) -> str:
    """'3 detections: straggler x2 (rank 1), data_stall x1 (rank 0)' for the lineage's health row."""
    counts: dict[str, list] = {}
    for d in detections:
        counts.setdefault(d["detector"], []).append(d.get("rank"))
    parts = []
    for detector, ranks in counts.items():
        named = sorted({r for r in ranks if r is not None})
        parts.append(f"{detector} x{len(ranks)}" + (f" (rank {', '.join(map(str, named))})" if named else ""))
    return f"{len(detections)} detection(s): " + ", ".join(parts)


def lineage_rows(record: dict, resolved: Mapping[str, str | None] | None = None) -> list[LineageRow]:
    """The facts of ``record``, in the order both the CLI and the UI show them.

    ``resolved`` (commit name, as in ``commit_ids``, -> what it resolves to in the store, None when
    it does not) adds to the data commits whether they still resolve; only the CLI asks the store.
    """

    def commit(name: str) -> str:
        if resolved is None:
            return record["data"][name]
        return f"{record['data'][name]}  (resolves: {'yes' if resolved.get(name) else 'no'})"

    training, test, figures = record["training"], record["evaluation"]["test"], record["training_figures"]
    folder = record.get("version_folder") or version_folder(record["model"], record["version"])  # a fixed layout
    rows = [
        LineageRow("checkpoint", record["checkpoint"]["uri"]),
        LineageRow("sha256", record["checkpoint"]["sha256"]),
        LineageRow("version folder", f"{folder['store_path']} at tag {folder['tag']} (export: {folder['export']})"),
        LineageRow("store", f"{record['data'].get('backend')} repository {record['data'].get('repository')}"),
        LineageRow("dataset", _dataset_fact(record["data"])),
        LineageRow("raw commit", commit("raw_commit")),
        LineageRow("shards commit", commit("shards_commit")),
        LineageRow("weights commit", record["checkpoint"]["commit"]),
        *([LineageRow("tensorboard", record["checkpoint"]["tensorboard_uri"])]
          if record["checkpoint"].get("tensorboard_uri") else []),
        LineageRow("code", f"git {record['code'].get('git_sha')} dirty={record['code'].get('dirty')}"),
        LineageRow("environment", f"python {record['environment']['python']}, torch {record['environment']['torch']}"),
        *([LineageRow("training pods", pod_summary(record["pod"]))] if record.get("pod") else []),
        LineageRow("training", f"model={training['config'].get('model', {}).get('name')} seed={training['seed']} "
                               f"world_size={training['world_size']} backend={training['backend']}"
                               f"{sharding_fact(training['config'])}"
                               + (f" elastic={training['config']['elastic']} nodes"
                                  if training["config"].get("elastic") else "")),
        LineageRow("figures", f"final_loss={figures.get('final_loss')} samples/s={figures.get('samples_per_second')}"),
        LineageRow("attempts", attempts_summary(record)),
        *([LineageRow("resizes", resizes_summary(training["resizes"]))] if training.get("resizes") else []),
        *([LineageRow("training logs", training["logs"], url=training["logs"])] if training.get("logs") else []),
        *([LineageRow("training health", detections_summary(training["detections"]))]
          if training.get("detections") else []),
        LineageRow("task", record.get("task", "classification")),
        *([LineageRow("best checkpoint", f"weights of step {figures['weights_from_step']} (best validation "
                                          f"{figures.get('monitor')} {figures.get('best_value'):.4f}; "
                                          f"{figures.get('steps')} steps trained"
                                          f"{', stopped early' if figures.get('stopped_early') else ''})")]
          if figures.get("weights_from_step") is not None and figures.get("best_value") is not None else []),
        *experiment_rows(record, LineageRow),
        LineageRow("test", metric_summary(test)),
        *([LineageRow("onnx", onnx_summary(record["serving"]["onnx"]))] if record.get("serving", {}).get("onnx") else []),
        *continuation_rows(record),
        LineageRow("quality gate", "passed" if record["quality_gate"]["passed"] else "FAILED"),
        LineageRow("dagster run", record["dagster"]["run_id"], url=record["dagster"]["run_url"]),
    ]
    rows.extend(LineageRow(f"lakeFS {name}", url, url=url) for name, url in record.get("links", {}).items())
    return rows


def attempt_facts(record: Mapping) -> dict[str, object]:
    """(attempts, restarts, resumed_from_step) of the training behind a record: from the runtime's
    per-attempt list when it has one, else from the last attempt's counts; None where the record
    predates them (a resumed run then still shows its resumed_from_step)."""
    training, figures = record.get("training") or {}, record.get("training_figures") or {}
    attempts = training.get("attempts")
    if attempts:
        resumed = [a.get("resumed_from_step") for a in attempts if a.get("resumed_from_step") is not None]
        # Every attempt but the last ended early and was started again (torchrun or Dagster).
        return {"attempts": len(attempts), "restarts": len(attempts) - 1,
                "resumed_from_step": resumed[-1] if resumed else None, "list": attempts}
    restarts = training.get("restart_count")
    return {"attempts": None if restarts is None else int(restarts) + 1, "restarts": restarts,
            "resumed_from_step": figures.get("resumed_from_step"), "list": None}


def attempts_summary(record: Mapping) -> str:
    """``1 attempt, no restart`` or ``3 attempts: 1 restarted (worker killed), 2 failed ..., 3 completed,
    resumed from step 40``: a resumed run never reads like a clean one."""
    facts = attempt_facts(record)
    if facts["list"]:
        parts = []
        for i, a in enumerate(facts["list"], start=1):
            part = f"{i} {a.get('ended')}" + (f" ({a['reason']})" if a.get("reason") else "")
            if a.get("resumed_from_step") is not None:
                part += f", resumed from step {a['resumed_from_step']}"
            if a.get("detections"):
                part += f", {len(a['detections'])} detection(s)"
            parts.append(part)
        return f"{facts['attempts']} attempt(s): " + "; ".join(parts)
    resumed = facts["resumed_from_step"]
    tail = f", resumed from step {resumed}" if resumed is not None else ""
    if facts["attempts"] is None:
        return f"not recorded (the record predates attempt counts){tail}"
    restarts = int(facts["restarts"])
    return (f"{facts['attempts']} attempt(s), {restarts} restart(s)" if restarts else "1 attempt, no restart") + tail


def resizes_summary(resizes: list[Mapping]) -> str:
    """``2: 3 -> 2 ranks at step 40 (a node left ...); 2 -> 3 ranks at step 60 (a node joined ...)``."""
    parts = []
    for r in resizes:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["at"])) + " UTC" if r.get("at") else "at an unknown time"
        step = f" from step {r['resumed_from_step']}" if r.get("resumed_from_step") is not None else ""
        parts.append(f"{r['from_world_size']} -> {r['to_world_size']} ranks{step}, {when} ({r.get('reason')})")
    return f"{len(resizes)}: " + "; ".join(parts)


# Metrics shown first when a split has them; the rest follow in name order.
_LEADING_METRICS = ("perplexity", "accuracy", "loss", "r2", "mse", "mae", "macro_f1", "micro_f1", "subset_accuracy")


COUNTS = ("num_samples", "num_tokens")  # how much a split's evaluation covered, not how well it went


def scalar_metrics(metrics: Mapping) -> dict[str, float]:
    """A split's evaluation figures that are numbers (the tasks also give tables and a confusion
    matrix), without the sample counts."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in COUNTS}


def metric_summary(metrics: Mapping) -> str:
    """A split's scalar metrics on one line: ``accuracy=0.9711 loss=0.0980 macro_f1=0.9702 (n=180)``."""
    scalars = scalar_metrics(metrics)
    order = [k for k in _LEADING_METRICS if k in scalars] + sorted(k for k in scalars if k not in _LEADING_METRICS)
    text = " ".join(f"{k}={scalars[k]:.4f}" for k in order)
    return f"{text} (n={metrics.get('num_samples')})"


def continuation_rows(record: Mapping) -> list[LineageRow]:
    """A language model's sampled continuations of held-out text, one row each: ``"prompt" -> "what
    the model wrote"``, whitespace folded so each stays one line."""
    samples = (record.get("serving") or {}).get("continuations") or []
    return [LineageRow(f"continuation {i}", f"{_one_line(s.get('prompt'))!r} -> {_one_line(s.get('continuation'))!r}")
            for i, s in enumerate(samples, start=1)]


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def sharding_fact(config: dict) -> str:
    """The training row's sharding, FSDP units and activation checkpointing, from the resolved
    config (its ``wrapping``, training_runtime/distributed/fsdp.py ``wrapping_summary``; the
    settings alone for a runtime that predates it), e.g. ' sharding=fsdp fsdp_units=24 (LoomBlock
    x12, Linear x12; by size) activation_checkpointing=on'."""
    train, wrapping = config.get("train") or {}, config.get("wrapping") or {}
    sharding = wrapping.get("sharding", train.get("sharding"))
    if sharding is None:
        return ""
    text = f" sharding={sharding}"
    if "units" in wrapping:
        classes = ", ".join(f"{k} x{v}" for k, v in wrapping["unit_classes"].items())
        text += f" fsdp_units={wrapping['units']}" + (f" ({classes}; {wrapping['unit_policy']})" if classes else
                                                      f" ({wrapping['unit_policy']})")
    elif train.get("fsdp_units"):
        text += f" fsdp_units={train['fsdp_units']}"
    if wrapping.get("activation_checkpointing", train.get("activation_checkpointing")):
        text += " activation_checkpointing=on"
    return text


def pod_summary(pod: Mapping) -> str:
    """The training processes' own environment on one line: image (digest, the commit it was built
    from), torch, CUDA and NCCL, GPU models and nodes."""
    build = pod.get("build") or {}
    digests = pod.get("image_digests") or []
    image = pod.get("image") or "no image (local launch)"
    if digests:
        image += "@" + ",".join(digests)
    built = (f" built from git {build.get('git_sha')} dirty={build.get('dirty')}" if build
             else " (no build record)")
    gpus = ", ".join(pod.get("gpus") or []) or "none (CPU)"
    return (f"{image}{built}; torch {pod.get('torch')}, CUDA {pod.get('cuda')}, NCCL {pod.get('nccl')}; "
            f"GPU {gpus}; nodes {', '.join(pod.get('nodes') or [])}")


def onnx_summary(row: Mapping) -> str:
    if not row.get("ok"):
        return f"export failed: {row.get('error')}"
    if not row.get("passed"):
        return (f"not shipped: onnxruntime differs from PyTorch by up to {row.get('max_abs_diff'):.2e} on "
                f"{row.get('num_samples')} test samples (tolerance {row.get('tolerance')})")
    return (f"model.onnx agrees with PyTorch on {row.get('num_samples')} test samples: largest difference "
            f"{row.get('max_abs_diff'):.2e} (tolerance {row.get('tolerance')})")


def _dataset_fact(data: dict) -> str:
    """``digits-d2 (location platform)``; records older than dataset versions name the dataset only."""
    where = f" (location {data['location']})" if data.get("location") else ""
    return f"{data.get('dataset_version') or data['dataset']}{where}"


# The UI has always called the raw commit this, and its users (and UI tests) look for the row by it;
# the terminal's narrower label column keeps the short name README shows.
MARKDOWN_FIELD_NAMES = {"raw commit": "raw data commit"}


def lineage_markdown(record: dict) -> str:
    """The record for the UI (model_version metadata): its heading and ``lineage_rows`` as a table,
    plus the data checks behind the version, which the CLI leaves to ``lineage --json``."""
    rows = [*lineage_rows(record), LineageRow("data checks", data_checks_summary(record))]
    cells = [(MARKDOWN_FIELD_NAMES.get(r.field, r.field), f"[{r.value}]({r.url})" if r.url else r.value) for r in rows]
    table = "\n".join(f"| {_markdown_cell(field)} | {_markdown_cell(value)} |" for field, value in cells)
    return f"{lineage_heading(record)}\n\n| field | value |\n| --- | --- |\n{table}"


def data_checks_summary(record: dict) -> str:
    """Each suite's verdict; the record's checks also hold plain facts (the dataset's name), left out."""
    verdicts = [f"{name}: {'passed' if result.get('passed') else 'FAILED'} ({result.get('evaluated')} expectations)"
                for name, result in record.get("checks", {}).items() if isinstance(result, dict)]
    return ", ".join(verdicts) or "none"


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare pipe would end the cell
