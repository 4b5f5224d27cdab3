"""From a ``task`` setting or a model card to a task: the built-in names, or a user's ``Task``
subclass by import path, checked before anything trains."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from training_runtime.data.info import DataInfo
from training_runtime.tasks.base import IMPORT_PATH_HINT, Task
from training_runtime.tasks.classification import ClassificationTask
from training_runtime.tasks.language_modeling import LanguageModelingTask
from training_runtime.tasks.multilabel import MultilabelTask
from training_runtime.tasks.names import BUILTIN_TASKS
from training_runtime.tasks.regression import RegressionTask

# ---------------------------------------------------------------- lookup
BUILTIN_CLASSES: dict[str, type[Task]] = {
    c.name: c for c in (ClassificationTask, LanguageModelingTask, MultilabelTask, RegressionTask)}
assert tuple(sorted(BUILTIN_CLASSES)) == BUILTIN_TASKS, "task_names.BUILTIN_TASKS must list BUILTIN_CLASSES"


def task_class(name: str) -> type[Task]:
    """The class a ``task`` setting names: a built-in name or 'package.module:ClassName'."""
    if name in BUILTIN_CLASSES:
        return BUILTIN_CLASSES[name]
    if ":" not in name:
        raise ValueError(f"task {name!r} is unknown; use one of {list(BUILTIN_TASKS)} or {IMPORT_PATH_HINT}")
    module, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"task {name!r} cannot be imported ({e}); check the import path and that its "
                         "package is installed where training runs") from e
    if not (isinstance(obj, type) and issubclass(obj, Task)):
        what = f"class {obj.__qualname__}" if isinstance(obj, type) else type(obj).__name__
        raise ValueError(f"task {name!r} is a {what}, not a Task subclass; it must name "
                         f"{IMPORT_PATH_HINT}")
    if inspect.isabstract(obj):
        missing = sorted(obj.__abstractmethods__)
        raise ValueError(f"task {name!r} leaves Task methods {missing} unimplemented; define them")
    _check_class_attributes(obj, name)
    return obj


def _check_class_attributes(cls: type[Task], ref: str) -> None:
    metric_names, monitor = getattr(cls, "metric_names", None), getattr(cls, "monitor", None)
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise ValueError(f"task {ref!r}: {cls.__qualname__}.name must be a non-empty string")
    if not (isinstance(metric_names, tuple) and metric_names and metric_names[0] == "loss"
            and all(isinstance(m, str) for m in metric_names)):
        raise ValueError(f"task {ref!r}: {cls.__qualname__}.metric_names must be a tuple of metric names "
                         f"starting with 'loss', got {metric_names!r}")
    if not (isinstance(monitor, tuple) and len(monitor) == 2 and monitor[0] in metric_names
            and monitor[1] in ("min", "max")):
        raise ValueError(f"task {ref!r}: {cls.__qualname__}.monitor must be (one of {list(metric_names)}, "
                         f"'min' or 'max'), got {monitor!r}")


def resolve_task(name: str, info: DataInfo) -> Task:
    """The task a run's ``task`` setting names, built for its data. ValueError naming ``task``,
    what is wrong and the fix when the name does not resolve or the data does not fit."""
    cls = task_class(name)
    try:
        return cls(info)
    except ValueError as e:
        fix = (f"set task to {info.task!r}, which the data was prepared for" if info.task != name
               else "prepare the data again with what is missing")
        raise ValueError(f"task {name!r} does not fit the data: {e}; {fix}") from e


def task_from_card(card: Mapping, info: DataInfo) -> Task:
    """Serving's task: the class a model card's task section names, rebuilt from that card."""
    ref = card.get("import_path") or card.get("name")
    if not isinstance(ref, str):
        raise ValueError(f"model card task section {dict(card)} names no task; it needs 'name'")
    return task_class(ref).from_card(card, info)
