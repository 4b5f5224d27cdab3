"""Running a sweep's trials: Optuna proposes, trainings run in parallel, the pruner stops laggards.

Optuna does the searching (its samplers and pruners); this module is the loop around it that a
training platform needs and Optuna's own ``study.optimize`` cannot give:

- a trial is a whole distributed training launched elsewhere (torchrun workers, Kubernetes pods),
  run in a thread that only waits for it, ``parallelism`` at a time;
- every call into the study (ask, report, should_prune, tell) happens on the calling thread, so
  the storage sees one writer;
- the validations a trial writes (training_runtime/train/trial_channel.py) are read as they come and
  reported to the pruner; a pruned trial is asked to stop, stops at its next validation and frees
  its slot for the next trial;
- a crashed trial is restarted ``retries`` times, resuming its own checkpoints, then counted as
  failed, and the sweep goes on;
- the study lives in a database, and a trial still RUNNING there when the sweep starts was cut
  off by a kill of the sweep. Its outcome is read from what its training wrote: a trial whose
  training had ended (its metrics.json) is told as it ended, pruned or complete, and never
  launched again (a relaunch would train 0 steps and overwrite its record); any other resumes
  from its checkpoints. Finished trials never run again. Each trial's launches are counted
  across the attempts of the sweep, and the runs that launched it are kept.

Nothing here imports Dagster: the op (ops/sweep.py) hands in how a trial is launched.
"""

from __future__ import annotations

import math
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from core.sweep import Choice, Range, Sweep, grid_of
from training_runtime.train.trial_channel import read_reports, request_stop

# What a finished trial's record says about it (Optuna's states, in words the lineage shows).
COMPLETE, PRUNED, FAILED = "complete", "pruned", "failed"


@dataclass
class TrialPlan:
    """One trial as launched: its parameters and its own folder (checkpoints, outputs, channel)."""

    number: int
    params: dict[str, Any]
    folder: Path
    resumed: bool = False  # cut off by a kill of an earlier attempt of the sweep; resumes its checkpoints
    logs_uri: str | None = None  # where its launch kept the workers' logs (set by ``launch``)

    @property
    def report_file(self) -> Path:
        return self.folder / "validations.jsonl"

    @property
    def metrics_file(self) -> Path:
        """What the trial's training writes when it ends (the runtime's metrics.json), pruned or not."""
        return self.folder / "output" / "metrics.json"

    @property
    def stop_file(self) -> Path:
        return self.folder / "stop"


@dataclass
class TrialRecord:
    """What the lineage, the UI's table and ``python -m pipelines sweeps`` show of a trial."""

    number: int
    params: dict[str, Any]
    state: str  # complete, pruned, failed
    value: float | None = None  # the objective: the best validation value the trial reached
    last_value: float | None = None  # the objective at its last validation (where a pruned trial stood)
    validations: int = 0
    pruned_step: int | None = None  # the training step it stopped at, when pruned
    steps: int | None = None
    attempts: int = 1  # launches of its training, over every attempt of the sweep
    wall_s: float | None = None
    error: str | None = None
    folder: str = ""
    # Cut off by a kill of an earlier attempt of the sweep, and finished by a later one.
    resumed: bool = False
    runs: list = field(default_factory=list)  # the runs that launched it or read its outcome, in order
    logs_uri: str | None = None  # its workers' logs in the artifact store (one folder per trial)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Running:
    trial: Any  # optuna.trial.Trial
    plan: TrialPlan
    started: float
    offset: int = 0
    # Training steps whose validation was read: a training restarted from a checkpoint validates
    # again the steps after it, and the file then holds them twice.
    seen_steps: set = field(default_factory=set)
    last_step: int | None = None
    prune_requested_at: int | None = None
    reported: set = field(default_factory=set)  # validation numbers Optuna already holds
    values: list = field(default_factory=list)  # the objective at each validation read
    earlier_attempts: int = 0  # launches by earlier attempts of the sweep (a killed run's)


@dataclass
class SweepResult:
    records: list[TrialRecord]
    best: TrialRecord | None
    study_name: str
    direction: str
    objective: str
    runs: list = field(default_factory=list)  # the study's ``runs``: each run that ran the sweep (ops/sweep.py)

    def summary(self) -> dict[str, Any]:
        states = [r.state for r in self.records]
        return {"study": self.study_name, "objective": self.objective, "direction": self.direction,
                "trials": len(self.records), "complete": states.count(COMPLETE), "pruned": states.count(PRUNED),
                "failed": states.count(FAILED), "best_trial": self.best.number if self.best else None,
                "best_value": self.best.value if self.best else None,
                "best_params": self.best.params if self.best else None}


def make_sampler(sweep: Sweep):
    import optuna

    if sweep.sampler == "grid":
        # The grid's values as the distributions hold them (``distributions``): a list choice,
        # such as hidden sizes, is its JSON text in both, or the grid point is not a choice.
        grid = {key: [_encode(v) for v in values] for key, values in grid_of(sweep.space).items()}
        return optuna.samplers.GridSampler(grid, seed=sweep.seed)
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=sweep.seed)
    return optuna.samplers.TPESampler(seed=sweep.seed, n_startup_trials=max(1, sweep.startup_trials))


def make_pruner(sweep: Sweep):
    """Pruners count steps in validations (1, 2, ...), not optimizer steps, so trials whose batch
    size or epoch count differ are still compared at the same point of their training."""
    import optuna

    if sweep.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=sweep.startup_trials,
                                           n_warmup_steps=sweep.prune_after_validations)
    if sweep.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, sweep.prune_after_validations))
    return optuna.pruners.NopPruner()


def distributions(sweep: Sweep) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for key, dim in sweep.space.items():
        if isinstance(dim, Choice):
            # Optuna stores categorical values as they are only for None/bool/int/float/str; lists
            # (e.g. hidden sizes) travel as their JSON text and are decoded in ``decode_params``.
            out[key] = CategoricalDistribution([_encode(v) for v in dim.values])
        elif isinstance(dim, Range) and dim.integer:
            out[key] = IntDistribution(int(dim.low), int(dim.high), log=dim.log,
                                       step=int(dim.step or 1) if not dim.log else 1)
        else:
            out[key] = FloatDistribution(dim.low, dim.high, log=dim.log, step=None if dim.log else dim.step)
    return out


def _encode(value: Any) -> Any:
    import json

    return value if value is None or isinstance(value, (bool, int, float, str)) else "json:" + json.dumps(value)


def decode_params(params: dict[str, Any]) -> dict[str, Any]:
    import json

    return {k: json.loads(v[5:]) if isinstance(v, str) and v.startswith("json:") else v for k, v in params.items()}


def open_study(storage_url: str, name: str, sweep: Sweep, direction: str):
    """The sweep's study, created on first use; a second attempt of the same sweep loads it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=name, storage=storage_url, direction=direction,
                               sampler=make_sampler(sweep), pruner=make_pruner(sweep), load_if_exists=True)


class SweepRunner:
    """Runs ``sweep`` in ``study``: ``launch(plan)`` trains one trial to the end and returns its
    metrics (the runtime's metrics.json), raising when it fails."""

    def __init__(self, sweep: Sweep, study: Any, *, objective: str, trial_root: Path,
                 launch: Callable[[TrialPlan], dict[str, Any]], log: Callable[[str], None] = print,
                 poll_s: float = 0.5, on_change: Callable[[list[TrialRecord]], None] | None = None,
                 run_id: str = "", recover: Callable[[TrialPlan], None] | None = None):
        """``run_id`` names this attempt of the sweep in each trial's ``runs``; ``recover(plan)`` is
        called for each trial cut off by an earlier attempt before its outcome is decided (the op
        reports there the messages the killed attempt had not read, and keeps the logs of a trial
        whose training had ended, setting ``plan.logs_uri``)."""
        self.sweep, self.study, self.objective = sweep, study, objective
        self.trial_root, self.launch, self.log, self.poll_s = Path(trial_root), launch, log, poll_s
        self.on_change, self.run_id, self.recover = on_change, run_id, recover
        self.distributions = distributions(sweep)

    # ------------------------------------------------------------ the loop
    def run(self) -> SweepResult:
        import optuna

        states = optuna.trial.TrialState
        trials = self.study.get_trials(deepcopy=False)
        finished = sum(t.state.is_finished() for t in trials)
        # Cut off by a kill of an earlier attempt: resume them first, under their own numbers.
        resume = [self._resumed(t) for t in trials if t.state == states.RUNNING]
        reported = {t.number: set(t.intermediate_values) for t in trials}
        attrs = {t.number: dict(t.user_attrs) for t in trials}
        budget = self.sweep.trials - finished - len(resume)
        if finished or resume:
            self.log(f"sweep {self.study.study_name}: {finished} trial(s) already finished, resuming {len(resume)}, "
                     f"{max(0, budget)} to start")
        # A cut-off trial whose training had ended is told from what it wrote, before any launch.
        relaunch = []
        for trial in resume:
            r = self._running(trial, True, reported, attrs)
            if self.recover is not None:
                self.recover(r.plan)
            metrics = read_metrics(r.plan.metrics_file)
            if metrics is None:
                relaunch.append(r)
                continue
            self.log(f"trial {r.plan.number} had ended before the kill ({r.plan.metrics_file}); its outcome is read "
                     "from what it wrote, and it is not launched again")
            self._watch(r, judge=False)
            self._conclude(r, metrics, 0, None)
            self._changed()
        running: dict[Future, _Running] = {}
        with ThreadPoolExecutor(max_workers=self.sweep.parallelism, thread_name_prefix="trial") as pool:
            while True:
                while len(running) < self.sweep.parallelism and (relaunch or budget > 0):
                    if relaunch:
                        r = relaunch.pop(0)
                    else:
                        r = self._running(self.study.ask(self.distributions), False, reported, attrs)
                        budget -= 1
                    plan = r.plan
                    r.trial.set_user_attr("attempts", r.earlier_attempts + 1)  # counted before a kill can cut it
                    self.log(f"trial {plan.number} {'resumes' if plan.resumed else 'starts'}: "
                             f"{_params_text(plan.params)}")
                    r.started = time.monotonic()
                    running[pool.submit(self._attempts, plan)] = r
                if not running:
                    break
                done, _ = wait(list(running), timeout=self.poll_s, return_when=FIRST_COMPLETED)
                for r in running.values():
                    self._watch(r)
                for future in done:
                    self._finish(running.pop(future), future)
                    self._changed()
        return self.result()

    def _running(self, trial: Any, resumed: bool, reported: dict, attrs: dict) -> _Running:
        """A trial about to be launched or told: its folder, and what earlier attempts left of it."""
        plan = TrialPlan(number=trial.number, params=decode_params(trial.params),
                         folder=self.trial_root / f"trial-{trial.number:03d}", resumed=resumed)
        plan.folder.mkdir(parents=True, exist_ok=True)
        before = attrs.get(trial.number, {})
        trial.set_user_attr("folder", str(plan.folder))
        trial.set_user_attr("runs", [*before.get("runs", []), *([self.run_id] if self.run_id else [])])
        if resumed:
            trial.set_user_attr("resumed", True)
        r = _Running(trial, plan, time.monotonic())
        r.reported = reported.get(trial.number, set())
        r.earlier_attempts = int(before.get("attempts", 0))
        return r

    def _resumed(self, frozen: Any):
        """The study's trial ``frozen``, cut off RUNNING, with every parameter of the space.

        ``study.ask`` stores a trial's row first and then its parameters one at a time, so a kill
        inside it leaves a RUNNING trial with only some of them (it had not launched yet). The
        missing ones are drawn now as ``ask`` would have drawn them (``Trial._suggest`` is what
        ``ask`` calls; it keeps a stored value), so the trial launches with the whole space
        instead of failing on a missing key."""
        import optuna

        trial = optuna.trial.Trial(self.study, frozen._trial_id)  # noqa: SLF001
        for name, distribution in self.distributions.items():
            trial._suggest(name, distribution)  # noqa: SLF001
        return trial

    def _attempts(self, plan: TrialPlan) -> tuple[dict[str, Any] | None, int, str | None]:
        """Runs on a pool thread: the trial's launches (a restart resumes its checkpoints)."""
        error = None
        for attempt in range(1, self.sweep.retries + 2):
            try:
                return self.launch(plan), attempt, None
            except Exception as exc:  # noqa: BLE001 (any failure of a trial is recorded; the sweep goes on)
                error = f"{type(exc).__name__}: {exc}"
                metrics = read_metrics(plan.metrics_file)
                if metrics is not None:
                    # The training ended and wrote its outcome; what failed came after (a restart
                    # would train 0 steps and overwrite it).
                    self.log(f"trial {plan.number}: its training ended ({plan.metrics_file}) before its launch failed "
                             f"({error.splitlines()[0][:300]}); its outcome is what it wrote")
                    return metrics, attempt, None
                if plan.stop_file.exists():
                    return None, attempt, error  # asked to stop: not worth a restart
                if getattr(exc, "allow_retries", True) is False:
                    return None, attempt, error  # the training's Failure says a restart would repeat it (a NaN)
                if attempt <= self.sweep.retries:
                    self.log(f"trial {plan.number} failed ({error.splitlines()[0][:300]}); restarting it "
                             f"from its checkpoints (attempt {attempt + 1} of {self.sweep.retries + 1})")
                    plan.resumed = True
        return None, self.sweep.retries + 1, error

    # ------------------------------------------------------------ pruning
    def _watch(self, r: _Running, judge: bool = True) -> None:
        """Report the trial's new validations to Optuna; with ``judge``, ask its pruner (not for a
        trial already ended)."""
        records, r.offset = read_reports(r.plan.report_file, r.offset)
        for record in records:
            value, step = record.get(self.objective), record.get("step")
            if step in r.seen_steps or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            r.seen_steps.add(step)
            r.last_step, n = step, len(r.seen_steps)
            r.values.append(float(value))
            # A resumed trial rereads validations Optuna already holds; reporting one twice is refused.
            if n not in r.reported:
                r.trial.report(float(value), n)
                r.reported.add(n)
            if judge and r.prune_requested_at is None and r.trial.should_prune():
                r.prune_requested_at = step
                request_stop(r.plan.stop_file, f"pruned by the sweep's {self.sweep.pruner} pruner after validation "
                                               f"{n} ({self.objective} {value:.4g})")
                self.log(f"trial {r.plan.number} pruned at validation {n} (step {step}, "
                         f"{self.objective} {value:.4g}); it stops at its next validation")

    def _finish(self, r: _Running, future: Future) -> None:
        self._watch(r)  # validations written just before the end
        metrics, attempts, error = future.result()
        r.trial.set_user_attr("wall_s", round(time.monotonic() - r.started, 1))
        self._conclude(r, metrics, attempts, error)

    def _conclude(self, r: _Running, metrics: dict[str, Any] | None, attempts: int, error: str | None) -> None:
        """Tell the study how the trial ended: ``metrics`` its training wrote (None when it failed)
        after ``attempts`` launches by this attempt of the sweep."""
        import optuna

        trial = r.trial
        attempts = r.earlier_attempts + attempts
        trial.set_user_attr("attempts", attempts)
        if r.plan.logs_uri:
            trial.set_user_attr("logs_uri", r.plan.logs_uri)
        if metrics is not None:
            trial.set_user_attr("steps", metrics.get("steps"))
        # Pruned when the training says it stopped for the request (metrics "pruned"), or failed after
        # it; a trial that finished before its next validation saw the request completed its work.
        pruned = bool((metrics or {}).get("pruned")) or (metrics is None and r.plan.stop_file.exists())
        if r.prune_requested_at is not None and not pruned and metrics is not None:
            self.log(f"trial {r.plan.number} finished before it saw the pruner's request; it counts as complete")
        if pruned:
            step = (metrics or {}).get("pruned_at_step") or r.prune_requested_at
            trial.set_user_attr("pruned_step", step)
            self._tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.log(f"trial {r.plan.number} stopped by the pruner at step {step}")
            return
        value = _objective_value(metrics, self.objective)
        if value is None and metrics is not None and r.values:
            # A custom training function's trial: the best validation it reported.
            value = (max if self.study.direction.name == "MAXIMIZE" else min)(r.values)
        if metrics is None or value is None:
            why = error or f"it reported no finite validation {self.objective}"
            trial.set_user_attr("error", why[-2000:])
            self._tell(trial, state=optuna.trial.TrialState.FAIL)
            self.log(f"trial {r.plan.number} failed after {attempts} attempt(s): {why.splitlines()[0][:300]}")
            return
        self._tell(trial, value)
        self.log(f"trial {r.plan.number} finished: {self.objective} {value:.4g} after {metrics.get('steps')} steps")

    def _tell(self, trial, *args, **kwargs) -> None:
        """``study.tell`` as ``study.optimize`` would make it. Optuna's grid sampler calls
        ``study.stop()`` once the last grid point is told, and outside ``optimize`` that raises
        RuntimeError (after the trial's state is stored): the step failed after every trial had
        finished, and its retry only found them done. This loop stops by its own trial budget, so
        the stop flag the sampler sets has no other effect here."""
        local = self.study._thread_local  # noqa: SLF001 (the flag study.stop() reads)
        was = local.in_optimize_loop
        local.in_optimize_loop = True
        try:
            self.study.tell(trial, *args, **kwargs)
        finally:
            local.in_optimize_loop = was

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.records())
            except Exception:  # noqa: BLE001 (showing progress must not end the sweep)
                self.log("could not show the sweep's progress:\n" + traceback.format_exc())

    # ------------------------------------------------------------ results
    def records(self) -> list[TrialRecord]:
        return trial_records(self.study)

    def result(self) -> SweepResult:
        records = self.records()
        done = [r for r in records if r.state == COMPLETE and r.value is not None]
        maximize = self.study.direction.name == "MAXIMIZE"
        best = (max if maximize else min)(done, key=lambda r: r.value) if done else None
        return SweepResult(records=records, best=best, study_name=self.study.study_name,
                           direction="maximize" if maximize else "minimize", objective=self.objective,
                           runs=list(self.study.user_attrs.get("runs", [])))


def trial_records(study: Any) -> list[TrialRecord]:
    """Every trial of the study as the platform shows it (unfinished ones as they stand)."""
    import optuna

    names = {optuna.trial.TrialState.COMPLETE: COMPLETE, optuna.trial.TrialState.PRUNED: PRUNED,
             optuna.trial.TrialState.FAIL: FAILED, optuna.trial.TrialState.RUNNING: "running",
             optuna.trial.TrialState.WAITING: "waiting"}
    out = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        out.append(TrialRecord(
            number=t.number, params=decode_params(t.params), state=names[t.state], value=t.value,
            last_value=t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None,
            validations=len(t.intermediate_values), pruned_step=a.get("pruned_step"), steps=a.get("steps"),
            attempts=a.get("attempts", 1), wall_s=a.get("wall_s"), error=a.get("error"), folder=a.get("folder", ""),
            resumed=bool(a.get("resumed")), runs=list(a.get("runs", [])), logs_uri=a.get("logs_uri")))
    return out


def read_metrics(path: Path) -> dict[str, Any] | None:
    """The metrics a trial's training wrote when it ended, or None when it has not ended. The
    runtime writes the file once, at the end, by a rename: a file that is there is whole."""
    import json

    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def _objective_value(metrics: dict[str, Any] | None, objective: str) -> float | None:
    """The best validation value of the objective: what keep_best kept, since a trial monitors
    its objective (``trial_overrides``)."""
    if not metrics:
        return None
    if metrics.get("monitor") == objective and isinstance(metrics.get("best_value"), (int, float)):
        value = float(metrics["best_value"])
        return value if math.isfinite(value) else None
    return None


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def trial_overrides(params: dict[str, Any], objective: str, direction: str) -> dict[str, dict[str, Any]]:
    """The overrides a trial trains with: its parameters, and its objective as the monitored metric,
    so keep_best keeps the weights the trial is judged by."""
    from core.sweep import space_overrides

    out = space_overrides(params)
    out.setdefault("train", {}).update({"monitor": objective,
                                        "monitor_mode": "max" if direction == "maximize" else "min"})
    return out
