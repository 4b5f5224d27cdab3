"""What a version's lineage keeps of the experiment behind it: the run's overrides of its pipeline
(what the pipeline said, what the run used) and the sweep whose best trial it is, every trial
listed with its parameters, value, state and pruned step."""

from __future__ import annotations

import json
from typing import Any, Mapping


def experiment_fields(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``overrides`` and ``sweep`` entries, from the checkpoint asset's value."""
    return {"overrides": dict(checkpoint.get("override_record") or {}), "sweep": checkpoint.get("sweep")}


def overrides_summary(record: Mapping[str, Mapping[str, Any]]) -> str:
    """``train.lr 0.01 -> 0.005, train.seed 0 -> 1``."""
    return ", ".join(f"{k} {json.dumps(v.get('pipeline'))} -> {json.dumps(v.get('run'))}" for k, v in record.items())


def sweep_summary(sweep: Mapping[str, Any]) -> str:
    """``trial 3 of 6 (best validation loss 0.1234; 4 complete, 2 pruned, 0 failed), study wine-...``."""
    value = sweep.get("best_value")
    shown = f"{value:.4g}" if isinstance(value, (int, float)) else value
    # A run that resumed the sweep (ops/sweep.py: a retry after its run worker died) says so.
    resumed = [r for r in sweep.get("runs") or [] if r.get("parent_run_id") or r.get("cut_off_trials")]
    return (f"trial {sweep.get('best_trial')} of {sweep.get('trials')} (best validation {sweep.get('objective')} "
            f"{shown}, {sweep.get('direction')}; {sweep.get('complete')} complete, {sweep.get('pruned')} pruned, "
            f"{sweep.get('failed')} failed), study {sweep.get('study')}" + "".join(
                f"; resumed by run {r.get('run_id')}, a retry of run {r.get('parent_run_id')}"
                + (f" whose run worker died ({r['parent_ended']})" if r.get("parent_ended") else "")
                + f", trials cut off: {', '.join(map(str, r.get('cut_off_trials') or [])) or 'none'}" for r in resumed))


def trial_line(trial: Mapping[str, Any]) -> str:
    """One trial: ``#2 pruned at step 40 (validation 3) value 0.31  train.lr=0.004 model.hidden=[32]``."""
    params = " ".join(f"{k}={_value(v)}" for k, v in (trial.get("params") or {}).items())
    state = trial.get("state")
    if state == "pruned" and trial.get("pruned_step") is not None:
        state = f"pruned at step {trial['pruned_step']}"
    value = "" if trial.get("value") is None else f" value {_value(trial['value'])}"
    notes = [f"{trial['attempts']} launches"] if (trial.get("attempts") or 1) > 1 else []
    notes += ["resumed after a kill"] if trial.get("resumed") else []
    how = "".join(f", {n}" for n in notes)
    logs = f"  logs {trial['logs_uri']}" if trial.get("logs_uri") else ""
    return f"#{trial.get('number')} {state}{value} ({trial.get('validations')} validations{how})  {params}{logs}"


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def experiment_rows(record: Mapping[str, Any], row: Any) -> list[Any]:
    """Lineage rows (``row`` is core.lineage.LineageRow): the overrides, the sweep and one per trial."""
    rows = []
    if record.get("overrides"):
        rows.append(row("overrides", overrides_summary(record["overrides"])))
    sweep = record.get("sweep")
    if sweep:
        rows.append(row("sweep", sweep_summary(sweep)))
        rows.extend(row(f"trial {t.get('number')}", trial_line(t)) for t in sweep.get("records") or [])
    return rows
