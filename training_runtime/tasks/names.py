"""Names of the built-in tasks and the metrics they report, without importing torch.

Pipeline definitions load in every Dagster process and check a run's ``task`` and its quality
gate (``{"test_perplexity": {"max": 12}}``: keys are ``<split>_<metric>``) when they load;
importing ``training_runtime.tasks`` there would import torch. ``tasks.py`` checks its classes
against these tables when it is imported.
"""

BUILTIN_TASKS = ("classification", "language_modeling", "multilabel", "regression")

# The scalar metrics each built-in task's ``TaskMetrics.compute()`` returns for every split,
# ``loss`` first (the training loss: for regression in normalised target units). Metrics that
# only some data gets are in OPTIONAL_METRICS; ``compute()`` also returns non-scalar extras
# (per-class tables, a confusion matrix) and a sample count, which are not listed here.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("loss", "accuracy", "macro_f1"),
    "language_modeling": ("loss", "perplexity", "accuracy"),
    "multilabel": ("loss", "subset_accuracy", "micro_f1", "macro_f1"),
    "regression": ("loss", "mse", "mae", "r2"),
}

# Scalars present only for some data: classification reports ``auroc`` when there are exactly
# two classes and both occur in the split. A quality gate may name them; a run whose data lacks
# them fails the gate at evaluation time rather than when the definitions load.
OPTIONAL_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("auroc",),
    "language_modeling": (),
    "multilabel": (),
    "regression": (),
}

# The metric early stopping and keep-best watch by default, and whether lower or higher is better.
DEFAULT_MONITOR: dict[str, tuple[str, str]] = {
    "classification": ("accuracy", "max"),
    "language_modeling": ("perplexity", "min"),
    "multilabel": ("micro_f1", "max"),
    "regression": ("mse", "min"),
}

assert set(TASK_METRICS) == set(OPTIONAL_METRICS) == set(DEFAULT_MONITOR) == set(BUILTIN_TASKS)
assert all(m[0] == "loss" for m in TASK_METRICS.values()), "loss comes first in every task's metrics"
assert all(DEFAULT_MONITOR[t][0] in TASK_METRICS[t] for t in BUILTIN_TASKS), "monitors are always-present metrics"

# Metrics where lower is better; any other metric is better higher (accuracy, F1, r2, auroc).
LOWER_IS_BETTER = ("loss", "mse", "mae", "perplexity")


def metric_mode(task: str, metric: str) -> str:
    """'min' or 'max': how a validation metric of a built-in task improves."""
    default = DEFAULT_MONITOR.get(task)
    if default is not None and default[0] == metric:
        return default[1]
    return "min" if metric in LOWER_IS_BETTER else "max"
