"""``train`` (one run with overrides) and ``sweeps`` (a model's sweeps, their trials, trials compared)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from pipelines.cli.errors import UsageError, execute_for_cli, failure_lines
from pipelines.cli.render import DIFF_MARK, format_value, table
from pipelines.profiles import Profile


def training_run_config(model: str, overrides: dict, sweep: bool | None) -> dict:
    """The run config that hands ``overrides`` to the model's training op (as the Launchpad does)."""
    config = dict(overrides)
    if sweep is not None:
        config["sweep"] = sweep
    return {"ops": {f"{model}__checkpoint": {"ops": {f"{model}_distributed_training": {"config": config}}}}}


def train_command(args: argparse.Namespace) -> int:
    from core.overrides import OVERRIDES_TAG, OverrideError, apply_overrides, override_record, overrides_tag, parse_set
    from pipelines.assembly import location_definitions
    from pipelines.cli.inspection import print_lineage
    from pipelines.cli.instance import dagster_instance
    from pipelines.cli.lookup import find_pipeline, workspace_of

    found = find_pipeline(args.model, workspace_of(args), args.location, trains=True)
    spec, specs = found.spec, found.specs
    try:
        overrides = parse_set(args.set or [])
        apply_overrides(spec, overrides)  # refused here, before anything runs, as the op would
    except OverrideError as exc:
        raise UsageError(str(exc)) from exc
    if args.no_sweep and spec.sweep is None:
        raise UsageError(f"pipeline {spec.name!r} declares no sweep; leave out --no-sweep")
    record = override_record(spec, overrides)
    # This environment's resources, with the folders the location imports its own code from, so
    # its workers import the team's code as the location's own processes do.
    profile = dataclasses.replace(Profile.from_environment(), code_paths=found.code_paths)
    owner = spec.dataset or spec.name  # a model on a shared dataset trains in its owner's job too
    defs = location_definitions(found.location.name, [s for s in specs if s.name in (spec.name, owner)
                                                      or s.dataset == owner], profile)
    tags = {OVERRIDES_TAG: overrides_tag(record)} if record else {}
    print(f"training {spec.name}" + (f" with {tags[OVERRIDES_TAG]}" if tags else " as its pipeline says")
          + (" (no sweep)" if args.no_sweep else f" (sweep: {spec.sweep.describe()})" if spec.sweep else ""))
    for line in dataset_notes(spec, args, profile):
        print(line)
    with dagster_instance() as instance:
        job_name, selection = training_target(spec)
        result = execute_for_cli(
            defs.resolve_job_def(job_name), instance=instance, raise_on_error=False, tags=tags, asset_selection=selection,
            run_config=training_run_config(spec.name, overrides, False if args.no_sweep else None))
    if not result.success:
        print("\n".join(failure_lines(result)), file=sys.stderr)
        return 1
    outcome = dataset_outcome(result, spec)
    print(f"Run {result.run_id} succeeded." + (f" {outcome}" if outcome else "") + "\n")
    return print_lineage(profile, spec.name, None, as_json=False)


def training_target(spec) -> tuple[str, list | None]:
    """(job, assets) a CLI training runs: the pipeline's own job. A model on a dataset of its own
    location runs in the dataset's job, its raw_dataset and shards first: as in that job, they
    compare the sources' data key with the newest published version's, reuse that version when
    they are unchanged ("reusing <dataset>-dN") and make the new version otherwise, which the model
    then trains on. (The model's own job trains on the shards last made, however the sources
    changed since.) A model on another location's dataset trains on a published version of it:
    ``dataset_notes`` says when that location's sources are newer."""
    import dagster as dg

    from pipelines.assembly import training_job_name

    if spec.dataset is None:
        return training_job_name(spec), None
    own = [dg.AssetKey([spec.name, "checkpoint"]), dg.AssetKey([spec.name, "model_version"])]
    if spec.published_elsewhere:
        return training_job_name(spec), own
    return f"{spec.dataset}_training", [dg.AssetKey([spec.dataset, "raw_dataset"]),
                                        dg.AssetKey([spec.dataset, "shards"]), *own]


def dataset_notes(spec, args: argparse.Namespace, profile: Profile) -> list[str]:
    """What ``train`` says of the dataset before it trains. On its own location's dataset: that
    the sources are checked first. On another location's: whether that location's sources changed
    since the version trained on (the newest, or the one the pipeline pins), which only that
    location's own job makes a version of."""
    if spec.dataset is None:
        return []
    if not spec.published_elsewhere:
        return [f"{spec.name} trains on dataset {spec.dataset!r}: its sources are checked against its newest version "
                "first (reused when unchanged, else the new version is made first)"]
    from assets.source import SourceError
    from assets.source_hashes import source_data_key
    from resources.store.base import StoreError
    from core.datasets import DATA_KEY, changed_parts, manifest_path, resolve_dataset_version
    from pipelines.cli.lookup import find_pipeline, workspace_of

    store = profile.store()
    try:
        newest, _ = resolve_dataset_version(store, spec.dataset, None)
        pinned, commit = resolve_dataset_version(store, spec.dataset, spec.dataset_version)
    except LookupError:
        return []  # nothing published: the training step stops, naming what to run
    try:
        owner = find_pipeline(spec.dataset, workspace_of(args), spec.dataset_location).spec
        key, _ = source_data_key(owner, store, profile.resources()["platform"].sources_root)
    except (UsageError, SourceError, StoreError, OSError) as exc:  # the owner's sources may be where only it reads them
        return [f"note: whether dataset {spec.dataset!r} (location {spec.dataset_location!r}) has newer sources than "
                f"{pinned} was not checked: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
    published = json.loads(store.get_object(commit, manifest_path(spec.dataset))).get(DATA_KEY) or {}
    changed = changed_parts(key, published) if published.get("sha256") != key["sha256"] else ()
    where = f"dataset {spec.dataset!r} (location {spec.dataset_location!r})"
    if spec.dataset_version is not None:
        if not changed and pinned == newest:
            return [f"{spec.name} trains on {pinned}, as its pipeline pins: {where} is unchanged since"]
        newer = (f"{where}'s {', '.join(changed)} differ from {pinned}'s" if changed else
                 f"{where} has newer versions (the newest is {newest})")
        return [f"note: {spec.name} is pinned to {pinned} (dataset_version) and newer sources exist: {newer}"
                + (f"; the newest version is {newest}" if changed and newest != pinned else "")
                + f". It trains on {pinned} as pinned; leave dataset_version out to train on the newest version"]
    if not changed:
        return [f"{spec.name} trains on {newest}, the newest version of {where}: its sources are unchanged since"]
    return [f"note: {where}'s {', '.join(changed)} differ from its newest version {newest}'s; {spec.name} trains on "
            f"{newest}: that location makes the new version (its job {spec.dataset}_training), then train again"]


def dataset_outcome(result, spec) -> str | None:
    """Which version of its own location's dataset a CLI training used: reused or newly made."""
    if spec.dataset is None or spec.published_elsewhere:
        return None
    meta = {}
    for event in result.get_asset_materialization_events():
        if event.asset_key is not None and event.asset_key.path[0] == spec.dataset:
            meta.update({k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()})
    if meta.get("reused_dataset_version"):
        return f"{spec.name} trained on {meta['reused_dataset_version']}, reused: the sources of {spec.dataset!r} are unchanged."
    if meta.get("dataset_version"):
        return f"{spec.name} trained on {meta['dataset_version']}, made by this run from the sources of {spec.dataset!r}."
    if meta.get("commit_id"):  # a dataset that trains a model of its own is published with that model's version
        return (f"{spec.name} trained on new shards of {spec.dataset!r} (commit {str(meta['commit_id'])[:12]}), made by "
                "this run: its sources, parameters or code changed since its newest version.")
    return None


# --- sweeps --------------------------------------------------------------------------------------
def sweeps_command(args: argparse.Namespace) -> int:
    import optuna

    from ops.sweep import sweep_storage_url
    from ops.sweep_trials import trial_records
    from pipelines.cli.instance import dagster_instance
    from pipelines.cli.lookup import find_pipeline, workspace_of

    if getattr(args, "location", None):
        find_pipeline(args.model, workspace_of(args), args.location, trains=True)
    with dagster_instance() as instance:
        storage = sweep_storage_url(instance)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = [s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
                 if s.user_attrs.get("model") == args.model]
    summaries.sort(key=lambda s: s.datetime_start or 0)
    if args.study:
        summaries = [s for s in summaries if s.study_name == args.study]
        if not summaries:
            raise UsageError(f"model {args.model!r} has no sweep {args.study!r}; `sweeps {args.model}` lists them")
    if not summaries:
        found = find_pipeline(args.model, workspace_of(args), getattr(args, "location", None), trains=True)
        where = f"code location {found.location.name!r}"
        print(f"model {args.model!r} has no sweeps: its pipeline ({where}) declares none" if found.spec.sweep is None
              else f"model {args.model!r} has no sweeps yet (its pipeline, {where}, runs one whenever it trains)")
        return 0
    studies = [(s, trial_records(optuna.load_study(study_name=s.study_name, storage=storage))) for s in summaries]
    if args.compare:
        (summary, records), = studies[-1:]  # the newest sweep, or the one --study names
        print(format_trial_compare(summary.study_name, records, args.compare))
        return 0
    if args.json:
        print(json.dumps([{"study": s.study_name, "run_id": s.user_attrs.get("run_id"),
                           "direction": s.direction.name.lower(), "space": s.user_attrs.get("space"),
                           "runs": s.user_attrs.get("runs", []),
                           "trials": [r.to_dict() for r in records]} for s, records in studies],
                         indent=2, sort_keys=True))
        return 0
    print("\n\n".join(format_sweep(s, records) for s, records in studies))
    return 0


def format_sweep(summary, records: list) -> str:
    direction = summary.direction.name.lower()
    done = [r for r in records if r.state == "complete" and r.value is not None]
    best = (max if direction == "maximize" else min)(done, key=lambda r: r.value) if done else None
    states = [r.state for r in records]
    head = (f"{summary.study_name}  (run {summary.user_attrs.get('run_id')}, {direction}, {len(records)} trials: "
            f"{states.count('complete')} complete, {states.count('pruned')} pruned, {states.count('failed')} failed"
            + (f"; best trial {best.number}" if best else "") + ")")
    params = sorted({k for r in records for k in r.params})
    rows = [["*" if best is not None and r.number == best.number else "", str(r.number), r.state,
             format_value(r.value), *(format_value(r.params.get(k)) for k in params), str(r.validations),
             format_value(r.pruned_step), format_value(r.steps),
             str(r.attempts) + (" (resumed)" if r.resumed else "")] for r in records]
    return "\n".join([head, *resumed_lines(summary.user_attrs.get("runs", [])),
                      *table(["", "trial", "state", "value", *params, "validations", "pruned at", "steps", "launches"],
                             rows)])


def resumed_lines(runs: list) -> list[str]:
    """A line for each run that resumed the sweep after an earlier one was cut off (ops/sweep.py)."""
    return [f"  resumed by run {r['run_id']} after run {r.get('parent_run_id') or '(an earlier attempt)'} ended"
            + (f": its run worker died ({r['parent_ended']})" if r.get("parent_ended") else "")
            + f"; trials cut off: {', '.join(map(str, r.get('cut_off_trials') or [])) or 'none'}"
            for r in runs if r.get("parent_run_id") or r.get("cut_off_trials")]


def trial_metrics(record) -> dict:
    """A trial's training figures, from the metrics.json in its folder (None when it wrote none)."""
    path = Path(record.folder) / "output" / "metrics.json"
    if not record.folder or not path.is_file():
        return {}
    metrics = json.loads(path.read_text())
    return {k: metrics.get(k) for k in ("final_loss", "best_value", "best_step", "steps", "samples_per_second",
                                         "stopped_early")}


def format_trial_compare(study: str, records: list, numbers: list[int]) -> str:
    """Trials side by side: parameters, outcome and training figures; ``*`` marks differences."""
    by_number = {r.number: r for r in records}
    missing = [n for n in numbers if n not in by_number]
    if missing:
        raise UsageError(f"sweep {study} has no trial {missing[0]}; its trials are {sorted(by_number)}")
    chosen = [by_number[n] for n in numbers]
    sections = [("parameters", lambda r: dict(r.params)),
                ("outcome", lambda r: {"state": r.state, "value": r.value, "validations": r.validations,
                                       "pruned at step": r.pruned_step, "attempts": r.attempts}),
                ("training figures", trial_metrics)]
    lines = [f"{study}: " + " vs ".join(f"trial {n}" for n in numbers)]
    for name, extract in sections:
        values = [extract(r) for r in chosen]
        keys = list(dict.fromkeys(k for v in values for k in v))
        body = []
        for key in keys:
            vals = [v.get(key, "—") for v in values]
            body.append([DIFF_MARK if any(x != vals[0] for x in vals[1:]) else "", key, *map(format_value, vals)])
        lines += ["", f"{name}:"]
        lines.extend(table(["", "field", *(f"trial {n}" for n in numbers)], body) if body else ["  (none)"])
    return "\n".join(lines)
