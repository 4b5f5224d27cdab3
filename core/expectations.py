"""Expectations most table pipelines want, built from the pipeline's declaration: class labels,
regression targets or multi-label 0/1 columns, per the pipeline's ``task``.

A pipeline's own suite (e.g. ``pipelines/models/digits_expectations.py``) calls these and adds
what it knows about its data (value ranges, row counts).
"""

from __future__ import annotations

from typing import Any, Protocol


class PipelineSpec(Protocol):
    """What the suites read of a pipeline spec (core.spec.PipelineSpec; this module sits below it,
    since the spec's default suite is built from these functions)."""

    feature_columns: tuple[str, ...]
    label_column: str
    class_names: tuple[str, ...]
    id_column: str | None
    task: str
    label_columns: tuple[str, ...]
    target_range: tuple[float, float] | None


NUMERIC_TYPES = ["int", "float", "int32", "int64", "float32", "float64", "Int64", "Float64"]
SPLIT_NAMES = ["train", "validation", "test"]


def _label_values(class_names: tuple[str, ...]) -> list[Any]:
    # CSV readers turn "3" into 3; both spell the same class.
    values: list[Any] = list(class_names)
    values += [int(c) for c in class_names if c.lstrip("-").isdigit()]
    return values


def _task(spec: PipelineSpec) -> str:
    return getattr(spec, "task", "classification")  # suites written for older specs


def standard_raw_expectations(
    spec: PipelineSpec, *, min_rows: int = 1, max_rows: int | None = None,
    value_range: tuple[float | None, float | None] | None = None, min_class_share: float = 0.0,
    allow_extra_columns: bool = True,
) -> dict[str, list]:
    """Schema, types, nulls, value ranges, targets, class (or label) balance, row counts and duplicates.

    Targets by task: classification labels in the declared classes, every class present;
    regression targets numeric, never null and inside ``target_range`` when declared; multi-label
    cells (table ``targets``) only 0 or 1 and every label positive at least once (table
    ``classes``, one row per label, ``min_class_share`` of rows when given).

    Extra columns are allowed by default (sources often carry bookkeeping columns); only the
    declared columns are stored. Pass ``allow_extra_columns=False`` to refuse them.
    """
    import great_expectations as gx

    E = gx.expectations
    task = _task(spec)
    targets = list(spec.label_columns) if task == "multilabel" else [spec.label_column]
    wanted = [*spec.feature_columns, *targets, *([spec.id_column] if spec.id_column else [])]
    rows: list = [
        E.ExpectTableColumnsToMatchSet(column_set=wanted, exact_match=not allow_extra_columns),
        E.ExpectTableRowCountToBeBetween(min_value=min_rows, max_value=max_rows),
    ]
    target_cells: list = []
    if task == "regression":
        rows += [E.ExpectColumnValuesToNotBeNull(column=spec.label_column),
                 E.ExpectColumnValuesToBeInTypeList(column=spec.label_column, type_list=NUMERIC_TYPES)]
        if spec.target_range is not None:
            low, high = spec.target_range
            rows.append(E.ExpectColumnValuesToBeBetween(column=spec.label_column, min_value=low, max_value=high))
    elif task == "multilabel":
        target_cells = [E.ExpectColumnValuesToNotBeNull(column="value"),
                        E.ExpectColumnValuesToBeInSet(column="value", value_set=[0, 1])]
    else:
        rows += [E.ExpectColumnValuesToNotBeNull(column=spec.label_column),
                 E.ExpectColumnValuesToBeInSet(column=spec.label_column, value_set=_label_values(spec.class_names))]
    rows.append(E.ExpectCompoundColumnsToBeUnique(column_list=list(spec.feature_columns), mostly=0.99))
    if spec.id_column:
        rows.append(E.ExpectColumnValuesToNotBeNull(column=spec.id_column))
        rows.append(E.ExpectColumnValuesToBeUnique(column=spec.id_column))
    features: list = [
        E.ExpectColumnValuesToNotBeNull(column="value"),
        E.ExpectColumnValuesToBeInTypeList(column="value", type_list=NUMERIC_TYPES),
    ]
    if value_range:
        low, high = value_range
        features.append(E.ExpectColumnValuesToBeBetween(column="value", min_value=low, max_value=high))
    classes: list = []
    if task == "classification":
        classes.append(E.ExpectColumnDistinctValuesToEqualSet(column="label", value_set=list(spec.class_names)))
    elif task == "multilabel":  # one row per label: its positive rows
        classes.append(E.ExpectColumnValuesToBeBetween(column="count", min_value=1))
    if min_class_share > 0 and task != "regression":
        classes.append(E.ExpectColumnValuesToBeBetween(column="share", min_value=min_class_share, max_value=1.0))
    suite = {"rows": rows, "features": features}
    if target_cells:
        suite["targets"] = target_cells
    suite["classes"] = classes  # last, as the chunked runner reports it (assets/quality/chunked.py)
    return suite


def standard_shard_expectations(
    spec: PipelineSpec, *, max_abs_feature: float = 1e3, max_fraction_error: float = 0.05,
) -> dict[str, list]:
    """Per-split counts and fractions, targets (label set, finite regression targets inside
    ``target_range``, multi-label 0/1 vectors with every label in the training split), finite
    features in a sane range, checksums."""
    import great_expectations as gx

    E = gx.expectations
    task = _task(spec)
    samples = [
        E.ExpectColumnDistinctValuesToEqualSet(column="split", value_set=SPLIT_NAMES),
        E.ExpectColumnValuesToBeInSet(column="finite", value_set=[True]),
        E.ExpectColumnValuesToBeBetween(column="max_abs", min_value=0, max_value=max_abs_feature),
    ]
    suite: dict[str, list] = {"samples": samples}
    if task == "regression":
        samples.append(E.ExpectColumnValuesToBeInSet(column="target_finite", value_set=[True]))
        if spec.target_range is not None:
            low, high = _float32_bounds(spec.target_range)
            samples.append(E.ExpectColumnValuesToBeBetween(column="target", min_value=low, max_value=high))
    elif task == "multilabel":
        samples.append(E.ExpectColumnValuesToBeInSet(column="target_binary", value_set=[True]))
        suite["labels"] = [  # one row per label; its name in "column", so a failure names it
            E.ExpectColumnDistinctValuesToEqualSet(column="column", value_set=list(spec.class_names)),
            E.ExpectColumnValuesToBeBetween(column="train_positives", min_value=1),
        ]
    else:
        k = len(spec.class_names)
        samples[1:1] = [
            E.ExpectColumnValuesToBeBetween(column="label", min_value=0, max_value=k - 1),
            E.ExpectColumnDistinctValuesToEqualSet(column="train_label", value_set=list(range(k))),
        ]
    suite["splits"] = [
        E.ExpectColumnValuesToBeBetween(column="num_samples", min_value=1),
        E.ExpectColumnValuesToBeBetween(column="fraction_error", min_value=0, max_value=max_fraction_error),
        E.ExpectColumnValuesToBeInSet(column="checksums_ok", value_set=[True]),
    ]
    return suite


def _float32_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """``target_range`` as the float32 values shards store: a target equal to a bound in the source
    rounds to the bound's float32, never past it (rounding keeps order)."""
    import numpy as np

    return float(np.float32(bounds[0])), float(np.float32(bounds[1]))
