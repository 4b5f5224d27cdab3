"""A sweep declared on a pipeline: which settings to search, what to optimise, and how many trials.

Each trial is one training of the pipeline with some of its settings changed, named as overrides
are (``train.lr``, ``model.hidden``; see core/overrides.py). Optuna samples them (TPE, random or
grid) and prunes trials whose validations lag (median rule or successive halving); the search
itself is Optuna's, this module only declares and checks. Checked when definitions load, each
mistake naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from core.spec_fields import fail, scalar_field_types

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "successive_halving", "none")
DIRECTIONS = ("minimize", "maximize")


@dataclass(frozen=True)
class Choice:
    """One of these values (numbers, text, booleans or lists)."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any):
        if len(values) == 1 and isinstance(values[0], (list, tuple)):
            values = tuple(values[0])
        object.__setattr__(self, "values", tuple(values))

    def describe(self) -> str:
        return "one of " + ", ".join(map(repr, self.values))


@dataclass(frozen=True, kw_only=True)
class Range:
    """A number in [low, high]: uniform, or uniform in log space (``log``); whole numbers with
    ``integer``; on a grid of ``step`` when given."""

    low: float
    high: float
    log: bool = False
    integer: bool = False
    step: float | None = None

    def describe(self) -> str:
        kind = "integer" if self.integer else "number"
        return f"{kind} in [{self.low}, {self.high}]" + (" (log)" if self.log else "") + (
            f" step {self.step}" if self.step else "")


def FloatRange(low: float, high: float, *, step: float | None = None) -> Range:  # noqa: N802 (reads as a type)
    return Range(low=low, high=high, step=step)


def LogRange(low: float, high: float) -> Range:  # noqa: N802
    return Range(low=low, high=high, log=True)


def IntRange(low: int, high: int, *, step: int = 1, log: bool = False) -> Range:  # noqa: N802
    return Range(low=low, high=high, integer=True, step=step, log=log)


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """Search ``space`` for the best ``objective`` (a validation metric of the task, e.g. "loss",
    "accuracy"), running ``trials`` trainings, at most ``parallelism`` at a time."""

    space: Mapping[str, Choice | Range]
    objective: str
    direction: str | None = None  # "minimize" / "maximize"; None: the task's own direction for the metric
    trials: int = 8
    parallelism: int = 2
    sampler: str = "tpe"
    pruner: str = "median"
    # Validations a trial always gets before the pruner may stop it, and trials that finish before
    # it judges any (Optuna's n_warmup_steps, in validations, and n_startup_trials).
    prune_after_validations: int = 1
    startup_trials: int = 2
    seed: int = 0  # the sampler's seed: the same sweep proposes the same trials
    retries: int = 1  # times a crashed trial is restarted (resuming its checkpoints) before it counts as failed

    def describe(self) -> str:
        return (f"{self.trials} trials ({self.parallelism} at a time), {self.sampler} sampler, {self.pruner} pruner, "
                f"objective: validation {self.objective}" + (f" ({self.direction})" if self.direction else ""))


def sweep_from(pipeline: str, value: Any) -> Sweep | None:
    """A Sweep from itself, None, or a mapping (YAML): ``space`` entries as ``{choice: [...]}``,
    ``{low, high, log, integer, step}`` or a plain list (a choice)."""

    if value is None or isinstance(value, Sweep):
        return value
    if not isinstance(value, Mapping):
        fail(pipeline, "sweep", f"{value!r} must be a Sweep or a mapping with space, objective, trials, ...")
    value = dict(value)
    space = {}
    for key, dim in dict(value.pop("space", None) or {}).items():
        if isinstance(dim, (Choice, Range)):
            space[key] = dim
        elif isinstance(dim, (list, tuple)):
            space[key] = Choice(*dim)
        elif isinstance(dim, Mapping) and set(dim) == {"choice"}:
            space[key] = Choice(*dim["choice"])
        elif isinstance(dim, Mapping):
            try:
                space[key] = Range(**dim)
            except TypeError as exc:
                fail(pipeline, f"sweep.space.{key}", f"{dict(dim)!r}: {exc}; give low and high (and log, integer, "
                      "step), a list of values, or {choice: [...]}")
        else:
            fail(pipeline, f"sweep.space.{key}", f"{dim!r}: give a list of values or a range {{low: x, high: y}}")
    try:
        return Sweep(space=space, **value)
    except TypeError as exc:
        fail(pipeline, "sweep", f"{exc}; the fields are space, objective, direction, trials, parallelism, sampler, "
              "pruner, prune_after_validations, startup_trials, seed, retries")


def check_sweep(spec: Any) -> None:
    """Everything about a pipeline's sweep that can be known without running it."""

    sweep, n = spec.sweep, spec.name
    if spec.model is None:
        fail(n, "sweep", "a dataset pipeline trains nothing to sweep; declare the sweep on a model pipeline")
    if not sweep.space:
        fail(n, "sweep.space", "is empty; name at least one setting to search, e.g. {'train.lr': LogRange(1e-4, 1e-1)}")
    types = scalar_field_types(type(spec.recipe))
    for key, dim in sweep.space.items():
        where = f"sweep.space.{key}"
        section, _, name = key.partition(".")
        if section not in ("train", "model") or not name or "." in name:
            fail(n, where, "name a recipe field as train.<field> or a model keyword argument as model.<name>")
        if section == "train" and name not in types:
            fail(n, where, f"the recipe has no field {name!r}; its fields are {sorted(types)}")
        if isinstance(dim, Choice):
            if not dim.values:
                fail(n, where, "the choice is empty; list at least one value")
            if len(set(map(repr, dim.values))) != len(dim.values):
                fail(n, where, f"{list(dim.values)} lists a value twice")
            continue
        if not isinstance(dim, Range):
            fail(n, where, f"{dim!r} is neither a Choice nor a Range")
        if section == "train" and types[name][0] not in (int, float):
            fail(n, where, f"train.{name} is a {types[name][0].__name__}; search it with a Choice, not a range")
        if section == "train" and types[name][0] is int and not dim.integer:
            fail(n, where, f"train.{name} is a whole number; use IntRange (integer: true)")
        if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
                   for b in (dim.low, dim.high)):
            fail(n, where, f"low {dim.low!r} and high {dim.high!r} must be finite numbers")
        if not dim.low < dim.high:
            fail(n, where, f"the range [{dim.low}, {dim.high}] is "
                  f"{'empty' if dim.low == dim.high else 'inverted'}; give low < high")
        if dim.log and dim.low <= 0:
            fail(n, where, f"a log range needs low > 0, got {dim.low}")
        if dim.log and dim.step not in (None, 1):
            fail(n, where, "a log range takes no step (Optuna samples it continuously)")
        if dim.step is not None and not dim.step > 0:
            fail(n, where, f"step {dim.step!r} must be positive")
        if dim.integer and not (float(dim.low).is_integer() and float(dim.high).is_integer()):
            fail(n, where, f"an integer range needs whole bounds, got [{dim.low}, {dim.high}]")
    for fname, low in (("trials", 1), ("parallelism", 1), ("prune_after_validations", 0), ("startup_trials", 0),
                       ("retries", 0)):
        value = getattr(sweep, fname)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            fail(n, f"sweep.{fname}", f"{value!r} must be a whole number of at least {low}")
    if sweep.parallelism > sweep.trials:
        fail(n, "sweep.parallelism", f"{sweep.parallelism} exceeds the {sweep.trials} trials; lower it")
    if sweep.sampler not in SAMPLERS:
        fail(n, "sweep.sampler", f"{sweep.sampler!r}: use one of {list(SAMPLERS)}")
    if sweep.pruner not in PRUNERS:
        fail(n, "sweep.pruner", f"{sweep.pruner!r}: use one of {list(PRUNERS)}")
    if sweep.sampler == "grid":
        ranges = [k for k, d in sweep.space.items() if isinstance(d, Range) and not d.step]
        if ranges:
            fail(n, f"sweep.space.{ranges[0]}", "the grid sampler needs a finite grid: give a Choice or a range "
                  "with a step")
    if sweep.direction is not None and sweep.direction not in DIRECTIONS:
        fail(n, "sweep.direction", f"{sweep.direction!r}: use 'minimize', 'maximize' or None (the task's own)")
    _check_objective(spec)


def _check_objective(spec: Any) -> None:
    """The objective must be a validation metric the task reports (built-in tasks: known now;
    a custom task's metrics are known when the training op imports it)."""
    from training_runtime.tasks.names import OPTIONAL_METRICS, TASK_METRICS  # without importing torch

    sweep = spec.sweep
    if ":" in spec.task or spec.task not in TASK_METRICS:
        return
    if spec.dataset is not None and spec.dataset_location is None and not spec.owner_fields_filled:
        return  # the task comes from the dataset's owner: checked again once sharing() fills it in
    known = TASK_METRICS[spec.task] + OPTIONAL_METRICS[spec.task]
    objective = sweep.objective.removeprefix("validation_")
    if objective not in known:
        fail(spec.name, "sweep.objective", f"{sweep.objective!r} is not a validation metric of task {spec.task!r}; "
              f"it reports {list(known)}")


def direction_of(spec: Any) -> str:
    """The sweep's direction: as declared, else the task's own for its objective metric."""
    sweep = spec.sweep
    if sweep.direction:
        return sweep.direction
    from training_runtime.tasks.names import metric_mode  # without importing torch

    return "maximize" if metric_mode(spec.task, objective_metric(spec)) == "max" else "minimize"


def objective_metric(spec: Any) -> str:
    return spec.sweep.objective.removeprefix("validation_")


def check_sweep_capacity(spec: Any, gpu_pool: int | None) -> None:
    """Parallel trials each hold the pipeline's GPUs: more than the pool has would only queue."""

    if spec.sweep is None or gpu_pool is None or spec.gpus == 0:
        return
    needed = spec.sweep.parallelism * spec.gpus
    if needed > gpu_pool:
        fail(spec.name, "sweep.parallelism", f"{spec.sweep.parallelism} trials at a time x {spec.gpus} GPU(s) each "
              f"= {needed} GPUs, but the GPU pool has {gpu_pool}; lower parallelism to at most "
              f"{gpu_pool // spec.gpus}")


def space_overrides(params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Optuna's parameters (``{"train.lr": 0.01}``) as overrides (``{"train": {"lr": 0.01}}``)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in params.items():
        section, _, name = key.partition(".")
        out.setdefault(section, {})[name] = value
    return out


def grid_of(space: Mapping[str, Choice | Range]) -> dict[str, list[Any]]:
    """The grid sampler's search space: every value of each dimension."""
    grid = {}
    for key, dim in space.items():
        if isinstance(dim, Choice):
            grid[key] = list(dim.values)
        else:
            count = int(round((dim.high - dim.low) / dim.step)) + 1
            values = [dim.low + i * dim.step for i in range(count)]
            grid[key] = [int(v) for v in values] if dim.integer else values
    return grid


def grid_size(space: Mapping[str, Choice | Range]) -> int:
    size = 1
    for values in grid_of(space).values():
        size *= len(values)
    return size
