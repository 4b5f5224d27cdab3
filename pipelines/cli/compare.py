"""What differs between model versions: the rows ``compare`` and ``diff`` show (and the notebook)."""

from __future__ import annotations

from core.lineage import attempt_facts, resizes_summary, scalar_metrics
from resources.store.base import VersionedStore

# Where a version's files were written is no parameter of it; its data shows as commits instead.
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
    for split in ("test", "validation"):  # each task's scalar metrics (accuracy, perplexity, r2, ...)
        if split in ev:
            for k, v in scalar_metrics(ev[split]).items():
                out[f"{split} {k}"] = v
            out[f"{split} samples"] = ev[split]["num_samples"]
    out["final training loss"] = fig.get("final_loss")
    out["steps"] = fig.get("steps")
    out["samples/s"] = fig.get("samples_per_second")
    if fig.get("weights_from_step") is not None:
        out["weights from step"] = fig.get("weights_from_step")
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


def experiment(record: dict) -> dict[str, object]:
    """The run's overrides of its pipeline (``run value (pipeline: its value)``) and the sweep trial
    it came from; records older than overrides have neither."""
    out: dict[str, object] = {k: f"{v.get('run')} (pipeline: {v.get('pipeline')})"
                              for k, v in (record.get("overrides") or {}).items()}
    sweep = record.get("sweep")
    if sweep:
        out["sweep"] = f"{sweep.get('study')}: best of {sweep.get('trials')} trials"
        out["sweep trial"] = sweep.get("best_trial")
        for k, v in (sweep.get("best_params") or {}).items():
            out[f"sweep {k}"] = v
    return out


def attempts(record: dict) -> dict[str, object]:
    """How the training got to its weights: attempts, restarts and the step the last one resumed
    from, so a resumed version never compares as identical to a clean one. "not recorded" for
    records older than attempt counts."""
    facts = attempt_facts(record)
    out: dict[str, object] = {
        "attempts": facts["attempts"] if facts["attempts"] is not None else "not recorded",
        "restarts": facts["restarts"] if facts["restarts"] is not None else "not recorded",
        "resumed from step": facts["resumed_from_step"]}
    for i, a in enumerate(facts["list"] or [], start=1):
        out[f"attempt {i}"] = f"{a.get('ended')}" + (f" ({a['reason']})" if a.get("reason") else "")
    # An elastic gang's resizes: a version trained through one never compares as a fixed-size one.
    training = record.get("training") or {}
    if training.get("resizes"):  # a version without shows "—" beside one with
        out["resizes"] = resizes_summary(training["resizes"])
    if (training.get("config") or {}).get("elastic"):
        out["elastic nodes"] = training["config"]["elastic"]
    return out


SECTIONS = (("overrides and sweep", experiment), ("parameters", parameters), ("metrics", metrics),
            ("attempts", attempts), ("data and code", data_facts))


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


def dataset_prefix(records: list[dict]) -> str:
    datasets = {r["data"].get("dataset") for r in records}
    return f"datasets/{datasets.pop()}/" if len(datasets) == 1 and None not in datasets else "datasets/"


def data_diff_rows(store: VersionedStore, left: dict, right: dict) -> list[tuple[str, str, int | None, int | None]]:
    """(change, path, size in left, size in right) between two versions' dataset commits."""
    prefix = dataset_prefix([left, right])
    a, b = left["data"]["shards_commit"], right["data"]["shards_commit"]
    sizes_a = {o.path: o.size_bytes for o in store.list_objects(a, prefix=prefix)}
    sizes_b = {o.path: o.size_bytes for o in store.list_objects(b, prefix=prefix)}
    return [(e.type, e.path, sizes_a.get(e.path), sizes_b.get(e.path)) for e in store.diff(a, b, prefix=prefix)]
