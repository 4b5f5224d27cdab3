"""A pipeline's sweep inside its training op: Optuna trials through the training launcher.

The checkpoint asset of a pipeline with a sweep is the best trial's checkpoint: the op runs the
trials (ops/sweep_trials.py), each one a training with its own folder under the run's checkpoint
directory, launched through the same launcher as any training (local torchrun or Kubernetes pods)
and holding its own GPU units. The model_version asset then evaluates and registers the best
trial's model as it would any checkpoint; the sweep's record (every trial's parameters, value,
state and pruned step) travels with the checkpoint into the version's lineage.

The study lives in the platform's database, beside the Dagster instance's own storage: SQLite
next to a local instance, a schema of its own ("optuna") in the PostgreSQL of a production one.
Its name is the pipeline and the root run: a retry of a killed run resumes the same study. The
retry says so in its log and in the killed run's: the run worker died, and this run resumes the
sweep from its study and its trials' checkpoints. The study keeps every run that ran the sweep
(``runs``), and the lineage shows them.
"""

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from core.overrides import apply_overrides
from core.spec import PipelineSpec
from core.sweep import direction_of, objective_metric
from ops.rank_logs import KeptLogs
from ops.sweep_trials import SweepResult, SweepRunner, TrialPlan, TrialRecord, open_study, trial_overrides
from resources.launch.durable_messages import catch_up
from resources.gpu_pool import gpu_units

OPTUNA_SCHEMA = "optuna"  # Optuna's tables (and its alembic_version) kept apart from Dagster's
SQLITE_FILE = "optuna.sqlite"


def sweep_storage_url(instance: dg.DagsterInstance) -> str:
    """Where studies live: the instance's PostgreSQL (schema ``optuna``), else SQLite beside it."""
    postgres = getattr(instance.run_storage, "postgres_url", None)
    if postgres:
        import sqlalchemy

        engine = sqlalchemy.create_engine(postgres)
        try:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
        finally:
            engine.dispose()
        sep = "&" if "?" in postgres else "?"
        return f"{postgres}{sep}options=-csearch_path%3D{OPTUNA_SCHEMA}"
    root = Path(instance.storage_directory())
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / SQLITE_FILE}"


def study_name(model: str, root_run: str) -> str:
    return f"{model}-{root_run}"


def run_sweep(context: dg.OpExecutionContext, spec: PipelineSpec, work_dir: Path, root_run: str, *,
              train: Callable[..., Any], result_from: Callable[[Path], Any],
              keep_logs: Callable[[Path], KeptLogs] | None = None) -> tuple[Any, SweepResult]:
    """Run the sweep of ``spec`` (already carrying the run's overrides); return the best trial's
    training result and the sweep's result. ``train(spec, folder, validation_files=, label=,
    logs_folder=)`` runs one training (ops/training.py), ``result_from(output_dir)`` reads one a
    finished training left, ``keep_logs(folder)`` keeps (again) the worker logs of a trial's
    launches so far, under its own folder of this run's logs."""
    sweep = spec.sweep
    objective, direction = objective_metric(spec), direction_of(spec)
    study = open_study(sweep_storage_url(context.instance), study_name(spec.name, root_run), sweep, direction)
    study.set_user_attr("model", spec.name)
    study.set_user_attr("run_id", context.run_id)
    study.set_user_attr("space", {k: d.describe() for k, d in sweep.space.items()})
    context.log.info(f"sweep {study.study_name}: {sweep.describe()}; {direction} validation {objective}")
    _record_run(context, study)
    step = context.asset_key.to_user_string()
    results: dict[int, Any] = {}

    def launch(plan: TrialPlan) -> dict:
        trial_spec = apply_overrides(spec, trial_overrides(plan.params, objective, direction))
        with gpu_units(context.instance, context.run_id, f"{step}/trial-{plan.number}", trial_spec.gpus,
                       log=context.log):
            # Each trial keeps its workers' logs in a folder of its own: parallel trials' launches
            # are all launch_0, and under one folder they overwrote each other.
            result = train(trial_spec, plan.folder, validation_files=(plan.report_file, plan.stop_file),
                           label=f"trial {plan.number}", logs_folder=plan.folder.name)
        results[plan.number] = result
        plan.logs_uri = result.logs.uri if result.logs else None
        return result.metrics

    runner = SweepRunner(sweep, study, objective=objective, trial_root=work_dir / "trials", launch=launch,
                         log=context.log.info, on_change=lambda records: _observe(context, records, objective),
                         run_id=context.run_id, recover=lambda plan: _recover(context, plan, keep_logs))
    outcome = runner.run()
    if outcome.best is None:
        # Each failed trial's own first line: the step's error must say why (a NaN, the store
        # down), not only point at the log.
        why = "".join(f"\ntrial {r.number}: {r.error.splitlines()[0][:500]}" for r in outcome.records if r.error)
        raise dg.Failure(description=f"sweep {study.study_name}: no trial finished with a validation {objective} "
                                     f"({outcome.summary()['pruned']} pruned, {outcome.summary()['failed']} failed); "
                                     f"see each trial's log above{why}",
                         metadata={"trials": trials_table(outcome.records)}, allow_retries=False)
    best = results.get(outcome.best.number)
    if best is None:  # finished by an earlier attempt of the sweep: its outputs are on the volume
        best = result_from(Path(outcome.best.folder) / "output")
        if getattr(best, "logs", None) is None and outcome.best.logs_uri:  # kept by the run that trained it
            best = dataclasses.replace(best, logs=KeptLogs(uri=outcome.best.logs_uri, files={}))
    context.log.info(f"sweep {study.study_name}: best trial {outcome.best.number} ({objective} "
                     f"{outcome.best.value:.4g}) with {outcome.best.params}")
    return best, outcome


def _recover(context: dg.OpExecutionContext, plan: TrialPlan, keep_logs: Callable[[Path], KeptLogs] | None) -> None:
    """A trial cut off by a killed attempt: report the messages its launches wrote that the dead
    run worker never read, and keep its workers' logs (the killed run may not have)."""
    catch_up(context, plan.folder)
    if keep_logs is not None:
        plan.logs_uri = keep_logs(plan.folder).uri


def _record_run(context: dg.OpExecutionContext, study: Any) -> None:
    """Keep this run in the study's ``runs``; when trials were cut off by an earlier attempt, say
    why in this run's log (and in the killed run's): its run worker died, and this run resumes."""
    import optuna

    cut_off = [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    finished = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
    parent = context.run.parent_run_id
    entry = {"run_id": context.run_id, "parent_run_id": parent, "cut_off_trials": cut_off}
    if cut_off or finished:
        death = worker_death(context.instance, parent) if parent else None
        entry["parent_ended"] = death
        where = f"run {parent}" if parent else "an earlier attempt of this step"
        why = (f"{where} ended when its run worker died ({death})" if death
               else f"{where} ended before the sweep did")
        context.log.warning(f"{why}; this run, its {'automatic retry' if parent else 'retry'}, resumes the sweep "
                            f"{study.study_name} from its study and its trials' checkpoints: {finished} trial(s) "
                            f"finished, trial(s) {', '.join(map(str, cut_off)) or 'none'} cut off, each read from "
                            "what it wrote or resumed from its checkpoints")
        if parent and death:
            parent_run = context.instance.get_run_by_id(parent)
            if parent_run is not None:
                context.instance.report_engine_event(
                    f"The run worker died ({death}). The platform's automatic retry, run {context.run_id}, resumes "
                    f"the sweep {study.study_name} from its study and its trials' checkpoints.", parent_run)
    study.set_user_attr("runs", [*study.user_attrs.get("runs", []), entry])


# What Dagster writes when a run's worker process is gone: the code server's "Run execution process
# for <run> was terminated by signal 9 (SIGKILL)" (followed by a guess about memory), and the run
# monitor's, from the platform's launcher (resources/run_launcher.py).
_DEATHS = (re.compile(r"run worker process \d+ is gone \(killed or crashed\)"),
           re.compile(r"(?<=process for )\S+ (was terminated by signal \d+ \(\w+\)|unexpectedly exited with code -?\d+)"))


def worker_death(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """How run ``run_id``'s run worker died, in Dagster's words, or None when its log says no such
    thing (it failed in a step, or was cancelled)."""
    kinds = {dg.DagsterEventType.ENGINE_EVENT, dg.DagsterEventType.RUN_FAILURE}
    for entry in instance.all_logs(run_id, of_type=kinds):
        for pattern in _DEATHS:
            if match := pattern.search(entry.message or ""):
                return match.group(0) if match.lastindex is None else f"its process {match.group(1)}"
    return None


def _observe(context: dg.OpExecutionContext, records: list[TrialRecord], objective: str) -> None:
    """The trials table so far, on the checkpoint asset while the sweep runs."""
    if context.has_assets_def and len(context.assets_def.keys) == 1:
        context.log_event(dg.AssetObservation(
            asset_key=context.assets_def.key, description=f"sweep progress: {len(records)} trial(s)",
            metadata={"sweep_trials": trials_table(records),
                      "sweep_finished_trials": sum(r.state in ("complete", "pruned", "failed") for r in records)}))


def trials_table(records: list[TrialRecord]) -> dg.TableMetadataValue:
    """The trials as a table the UI sorts and shows: one row per trial."""
    params = sorted({k for r in records for k in r.params})
    columns = [dg.TableColumn("trial", "int"), dg.TableColumn("state", "string"),
               dg.TableColumn("value", "float", description="objective: best validation value"),
               *[dg.TableColumn(k, "string") for k in params],
               dg.TableColumn("validations", "int"), dg.TableColumn("pruned_step", "int"),
               dg.TableColumn("steps", "int"), dg.TableColumn("attempts", "int")]
    rows = []
    for r in records:  # every row has every column (Dagster's rule); None where a trial has no value
        row = {"trial": r.number, "state": r.state, "value": None if r.value is None else float(r.value),
               **{k: _short(r.params[k]) if k in r.params else None for k in params},
               "validations": r.validations, "attempts": r.attempts,
               **{k: None if getattr(r, k) is None else int(getattr(r, k)) for k in ("pruned_step", "steps")}}
        rows.append(dg.TableRecord(row))
    return dg.MetadataValue.table(records=rows, schema=dg.TableSchema(columns=columns))


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def sweep_record(outcome: SweepResult) -> dict:
    """What the checkpoint value (and so the lineage) keeps of the sweep, with every run that ran it
    (a killed run's retry names the run it resumed and the trials it found cut off)."""
    return {**outcome.summary(), "records": [r.to_dict() for r in outcome.records], "runs": outcome.runs}


def sweep_metadata(outcome: SweepResult, model: str) -> dict:
    from ops import plots  # deferred: matplotlib is not needed to load definitions

    summary = outcome.summary()
    png = plots.sweep_png([r.to_dict() for r in outcome.records], outcome.objective, outcome.direction,
                          f"{model}: sweep {outcome.study_name}")
    return {"sweep_trials": trials_table(outcome.records),
            "sweep_objective": dg.MetadataValue.md(plots.markdown_image(png, "objective per trial")),
            "sweep_best_trial": summary["best_trial"], "sweep_study": outcome.study_name,
            "sweep_pruned_trials": summary["pruned"], "sweep_failed_trials": summary["failed"]}
