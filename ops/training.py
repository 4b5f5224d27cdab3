"""The distributed training op: launch the runtime on the pinned shards, collect its results.

``build_training_op(spec)`` is the op the checkpoint asset runs (assets/pipeline.py composes it
as a graph-backed asset): it holds the pipeline's GPU units, launches the workers through the
launcher resource, and commits the weights to the run branch.
"""


import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from core.code_version import code_version
from core.overrides import (
    OVERRIDES_TAG,
    SECTIONS as OVERRIDE_SECTIONS,
    OverrideError,
    apply_overrides,
    override_record,
    overrides_config_schema,
    overrides_tag,
)
from core.pinned_shards import read_pinned_shards
from core.spec import PipelineSpec
from ops import training_config as training
from ops.live_tensorboard import LiveTensorBoard
from ops.rank_logs import KeptLogs, keep_rank_logs
from ops.sweep import run_sweep, sweep_metadata, sweep_record
from ops.runs import commit_metadata, commit_or_head, ensure_run_branch, root_run_id
from ops.tensorboard_events import upload_event_files
from resources.gpu_pool import gpu_units
from resources.launch.base import TrainingLauncher
from resources.platform import (
    ArtifactStoreResource,
    PlatformSettings,
    TrainingLauncherResource,
    VersionedStoreResource,
)
from resources.store.base import VersionedStore
from training_runtime.observe.attempts import Attempt, LaunchOutcome, attempts_root, next_launch, read_attempts

WEIGHTS_FILE = "model.safetensors"
# What a training run leaves in its output directory, committed beside each other on the run branch.
MODEL_FILES = (WEIGHTS_FILE, "model_card.json", "resolved_config.json", "metrics.json")
# ...and those only some runs write: the training job's own evaluation (recipe evaluate_on "training").
OPTIONAL_MODEL_FILES = ("evaluation.json",)


@dataclass
class TrainingResult:
    output_dir: Path
    metrics: dict
    resolved_config: dict
    weights_sha256: str
    telemetry: list[dict] = field(default_factory=list)
    logs: KeptLogs | None = None  # every rank's (or pod's) log files in the artifact store

    def metadata(self, model: str) -> dict:
        figures = training.training_figures(self.metrics)
        meta: dict = {k: v for k, v in figures.items() if v is not None}
        meta["weights_sha256"] = self.weights_sha256
        meta["backend"] = str(self.metrics.get("backend"))
        if self.metrics.get("per_rank_step_time_s"):
            meta["per_rank_step_time_s"] = dg.MetadataValue.json(self.metrics["per_rank_step_time_s"])
        if self.metrics.get("best_step") is not None:
            meta["monitor"] = f"validation {self.metrics['monitor']} (best at step {self.metrics['best_step']})"
        if self.metrics.get("loss_history"):
            from ops import plots  # deferred: matplotlib is not needed to load definitions

            png = plots.loss_curve_png(self.metrics["loss_history"], f"{model}: training loss")
            meta["loss_curve"] = dg.MetadataValue.md(plots.markdown_image(png, "loss curve"))
        if self.telemetry:
            last = self.telemetry[-1]
            meta["last_telemetry"] = dg.MetadataValue.json(last)
        if self.logs:
            meta.update(self.logs.metadata())
        return meta


def run_distributed_training(
    context: dg.AssetExecutionContext, spec: PipelineSpec, shards: dict, store: VersionedStore,
    launcher: TrainingLauncher, work_dir: Path, artifacts=None, *,
    validation_files: tuple[Path, Path] | None = None, label: str = "", logs_folder: str | None = None,
) -> TrainingResult:
    """Train on the shards at their pinned commit; resumes from ``work_dir``'s checkpoints.
    ``validation_files``: a sweep trial's (report, stop) files (training_runtime/train/trial_channel.py)."""
    pinned = read_pinned_shards(store, shards["commit_id"], shards["manifest_path"])
    output_dir, checkpoint_dir = work_dir / "output", work_dir / "checkpoints"
    config = training.runtime_config(
        spec, manifest=pinned.manifest, locations=pinned.locations, commit_id=shards["commit_id"],
        checkpoint_dir=checkpoint_dir, output_dir=output_dir, s3_endpoint_url=pinned.s3_endpoint_url,
        # Each launch (a Dagster retry, a re-execution) names its attempts' records apart.
        launch=next_launch(attempts_root(checkpoint_dir)),
    )
    if validation_files is not None:
        config["validation"].update(report_file=str(validation_files[0]), stop_file=str(validation_files[1]))
    job = dataclasses.replace(training.training_job(spec, root_run_id(context), config), code_version=code_version())
    context.log.info(f"Launching {job.nnodes}x{job.nproc_per_node} training workers for {spec.name}"
                     f"{f' ({label})' if label else ''} on shards commit {shards['commit_id'][:12]}")
    try:
        invocation = launcher.launch(context, job)
    except Exception:
        outcome = launcher.failure_of(job)
        if outcome is None:  # no record: the workers were killed before they could say why
            raise
        # Not chained: the launcher's own error ("process failed with code 1") and its stack trace
        # would follow the runtime's words in every place Dagster prints the failure.
        raise training_failure(context, spec, outcome) from None
    finally:  # every rank's logs are kept, a failed training's above all
        logs = keep_rank_logs(context, artifacts, launcher, job, folder=logs_folder) if artifacts is not None else None
    # A training that recovered (torchrun restarted its workers) says from what, hang stacks included.
    log_attempts(context, [a for a in read_attempts(attempts_root(checkpoint_dir)) if a.id.launch == config["launch"]])
    telemetry = [m for m in invocation.get_custom_messages() if isinstance(m, dict) and m.get("kind") == "telemetry"]
    return training_result_from(output_dir, logs=logs, telemetry=telemetry)


def training_failure(context: dg.OpExecutionContext, spec: PipelineSpec, outcome: LaunchOutcome) -> dg.Failure:
    """The step's failure in the runtime's words. A failure a new attempt would repeat (a
    non-finite stop, user code that cannot be imported or called, a config error) is not retried;
    others (a killed worker, a lost node, a hang, an outage) are, by the op's retry policy."""
    # The attempts before the last one are logged; the last one's reason is the failure's own text.
    log_attempts(context, outcome.attempts[:-1])
    log_hang_stacks(context, outcome.attempts[-1])
    metadata = {"attempts": dg.MetadataValue.json([{"attempt": a.id.name, **a.to_metrics()} for a in outcome.attempts])}
    if outcome.last_good_checkpoint:
        metadata["last_good_checkpoint"] = outcome.last_good_checkpoint
    if outcome.deterministic:
        return dg.Failure(description=f"training {spec.name!r} failed, not retried (a new attempt would fail the "
                                      f"same way): {outcome.message}", metadata=metadata, allow_retries=False)
    return dg.Failure(description=f"training {spec.name!r} failed: {outcome.message}; a retry resumes from the last "
                                  "checkpoint", metadata=metadata, allow_retries=True)


def log_attempts(context: dg.OpExecutionContext, attempts: Sequence[Attempt]) -> None:
    """A warning for each attempt that did not complete (torchrun restarted it, or it failed),
    naming why, then the stacks of any hang that ended it."""
    for attempt in attempts:
        if attempt.ended == "completed":
            continue
        context.log.warning(f"attempt {attempt.id.name} {attempt.ended}: {attempt.reason or 'no reason recorded'}")
        log_hang_stacks(context, attempt)


def log_hang_stacks(context: dg.OpExecutionContext, attempt: Attempt) -> None:
    """The Python stacks each rank's hang watchdog took when it fired in ``attempt`` (its failure
    records carry them, cut to each thread's innermost frames), as a warning in the run's event
    log: the UI's user sees what every thread was doing without opening the rank logs."""
    for failure in attempt.failures:
        if failure.get("cause") == "hang" and failure.get("stacks"):
            context.log.warning(f"hang in attempt {attempt.id.name}: stacks of rank {failure.get('rank')} when its "
                                f"watchdog fired (the whole dump is in that rank's log):\n{failure['stacks']}")


def training_result_from(output_dir: Path, *, logs: KeptLogs | None = None,
                         telemetry: list[dict] | None = None) -> TrainingResult:
    """What a finished training left in ``output_dir``."""
    metrics_file = output_dir / "metrics.json"
    if not metrics_file.exists():
        raise dg.Failure(description=f"training finished without writing {metrics_file}; see the run's logs")
    weights = output_dir / WEIGHTS_FILE
    if not weights.exists():
        raise dg.Failure(description=f"training finished without writing {weights}; see the run's logs")
    return TrainingResult(
        logs=logs,
        output_dir=output_dir,
        metrics=json.loads(metrics_file.read_text()),
        resolved_config=json.loads((output_dir / "resolved_config.json").read_text()),
        weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
        telemetry=list(telemetry or []),
    )


def check_user_code(spec: PipelineSpec) -> None:
    """User code named by import path is imported here, before any worker starts (definitions only
    check that its modules exist: they must load without torch). The training function must take
    one argument, a model factory must be callable, a task must be a Task whose metrics cover the
    quality gate (built-in tasks' gates are checked when definitions load)."""
    from training_runtime.config import ConfigError
    from training_runtime.models.builtin import resolve_factory
    from training_runtime.train.user_loop import resolve_train_fn

    try:
        if spec.train is not None:
            resolve_train_fn(spec.train)
        if spec.model and ":" in spec.model:
            resolve_factory(spec.model)
    except (ConfigError, ValueError) as exc:
        field = "train" if spec.train and spec.train in str(exc) else "model"
        raise dg.Failure(description=f"pipeline {spec.name!r}, field {field!r}: {exc}", allow_retries=False) from exc
    if ":" not in spec.task:
        return
    from training_runtime.tasks.registry import task_class

    try:
        cls = task_class(spec.task)
    except ValueError as exc:
        raise dg.Failure(description=f"pipeline {spec.name!r}, field 'task': {exc}", allow_retries=False) from exc
    unknown = [k for k in spec.gate.all_bounds() if k.partition("_")[2] not in cls.metric_names]
    if unknown:
        raise dg.Failure(description=f"pipeline {spec.name!r}, field 'gate.{unknown[0]}': task {spec.task!r} does not "
                                     f"produce {unknown[0].partition('_')[2]!r}; its metrics are "
                                     f"{list(cls.metric_names)}", allow_retries=False)


def spec_for_run(context: dg.OpExecutionContext, spec: PipelineSpec, overrides: dict) -> PipelineSpec:
    """The pipeline as this run trains it; a run that changes it is tagged with what it changed."""
    try:
        run_spec = apply_overrides(spec, overrides)
    except OverrideError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    record = override_record(spec, overrides)
    if record:
        context.instance.add_run_tags(context.run_id, {OVERRIDES_TAG: overrides_tag(record)})
        context.log.info("this run overrides the pipeline: " + ", ".join(
            f"{k} {v['pipeline']!r} -> {v['run']!r}" for k, v in record.items()))
    return run_spec


def override_metadata(record: dict) -> dict:
    if not record:
        return {}
    return {"overrides": dg.MetadataValue.md("| field | pipeline | this run |\n| --- | --- | --- |\n" + "\n".join(
        f"| {k} | {json.dumps(v['pipeline'])} | {json.dumps(v['run'])} |" for k, v in record.items()))}


def build_training_op(spec: PipelineSpec) -> dg.OpDefinition:
    """The distributed training op of one pipeline: shards (pinned commit) in, checkpoint out."""
    name = spec.name

    config_schema = overrides_config_schema(spec)
    if spec.sweep is not None:
        config_schema["sweep"] = dg.Field(bool, default_value=True, description=(
            f"Run the pipeline's sweep ({spec.sweep.describe()}) and keep its best trial; false trains the "
            "recipe (with this run's overrides) once."))

    @dg.op(name=f"{name}_distributed_training", retry_policy=dg.RetryPolicy(max_retries=1, delay=2),
           tags={"platform/gpus": str(spec.gpus)}, ins={"shards": dg.In(dict)}, out=dg.Out(dict),
           config_schema=config_schema,
           description=f"Train {spec.model} with torchrun workers on {spec.dataset_name}'s pinned shards; "
                       "a retry resumes from the run's checkpoints. Its config changes the pipeline's settings "
                       "for one run (recorded in the lineage as overrides).")
    def distributed_training(context: dg.OpExecutionContext, shards: dict, platform: PlatformSettings,
                             store: VersionedStoreResource, artifacts: ArtifactStoreResource,
                             launcher: TrainingLauncherResource):
        overrides = {k: v for k, v in (context.op_config or {}).items() if k in OVERRIDE_SECTIONS and v}
        run_spec = spec_for_run(context, spec, overrides)
        check_user_code(run_spec)
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        work_dir = platform.checkpoints_root / name / root_run_id(context)
        folder = f"models/{name}/checkpoints/{context.run_id}/"
        # Each training's curves reach TensorBoard while it trains; the run's log and metadata link them.
        live = LiveTensorBoard(context, artifacts.get(), folder=folder, run_dir=work_dir,
                               tensorboard_url=platform.tensorboard_url)
        sweep = None
        if run_spec.sweep is not None and context.op_config.get("sweep", True):
            def train_trial(trial_spec: PipelineSpec, trial_dir: Path, **kw) -> TrainingResult:
                with live.watching(trial_dir):
                    return run_distributed_training(context, trial_spec, shards, s, launcher.get(), trial_dir,
                                                    artifacts.get(), **kw)

            def trial_logs(trial_dir: Path) -> KeptLogs:  # a trial's job, named as its launches name it
                job = training.training_job(run_spec, root_run_id(context),
                                            {"checkpoint": {"dir": str(trial_dir / "checkpoints")}})
                return keep_rank_logs(context, artifacts.get(), launcher.get(), job, folder=trial_dir.name)

            result, outcome = run_sweep(context, run_spec, work_dir, root_run_id(context), train=train_trial,
                                        result_from=training_result_from, keep_logs=trial_logs)
            sweep = (sweep_record(outcome), sweep_metadata(outcome, name))
        else:
            with gpu_units(context.instance, context.run_id, context.asset_key.to_user_string(), run_spec.gpus,
                           log=context.log), live.watching(work_dir):
                result = run_distributed_training(context, run_spec, shards, s, launcher.get(), work_dir,
                                                  artifacts.get())
        weights_path = folder + WEIGHTS_FILE
        weights_uri = artifacts.get().put_file(result.output_dir / WEIGHTS_FILE, weights_path)
        for file in MODEL_FILES:
            s.put_file(branch, folder + file, result.output_dir / file)
        for file in OPTIONAL_MODEL_FILES:
            if (result.output_dir / file).is_file():
                s.put_file(branch, folder + file, result.output_dir / file)
        commit_id = commit_or_head(s, branch, f"Train {name}", commit_metadata(
            context, platform.run_url(context.run_id), shards_commit=shards["commit_id"], dataset=shards["dataset"]))
        # TensorBoard event files beside the weights; their location travels on to the lineage record.
        events = upload_event_files(artifacts.get(), result.resolved_config, folder)
        value = {"commit_id": commit_id, "weights_path": weights_path, "weights_uri": weights_uri,
                 "weights_sha256": result.weights_sha256, "shards_commit": shards["commit_id"],
                 "dataset_version": shards.get("dataset_version"), **events,
                 "logs_uri": result.logs.uri if result.logs else None,
                 # What this run changed (the evaluation applies the same gate) and its sweep, for the lineage.
                 "overrides": overrides, "override_record": override_record(spec, overrides),
                 "sweep": sweep[0] if sweep else None}
        return dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
            **result.metadata(name), "commit_id": commit_id, "weights_uri": weights_uri,
            "dataset": shards["dataset"], "shards_commit": shards["commit_id"], **events, **live.metadata(),
            **override_metadata(value["override_record"]), **(sweep[1] if sweep else {})})

    return distributed_training
