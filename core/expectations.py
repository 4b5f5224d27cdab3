"""Expectations most classification pipelines want, built from the pipeline's declaration.

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


NUMERIC_TYPES = ["int", "float", "int32", "int64", "float32", "float64", "Int64", "Float64"]


def _label_values(class_names: tuple[str, ...]) -> list[Any]:
    # CSV readers turn "3" into 3; both spell the same class.
    values: list[Any] = list(class_names)
    values += [int(c) for c in class_names if c.lstrip("-").isdigit()]
    return values


def standard_raw_expectations(
    spec: PipelineSpec, *, min_rows: int = 1, max_rows: int | None = None,
    value_range: tuple[float | None, float | None] | None = None, min_class_share: float = 0.0,
    allow_extra_columns: bool = True,
) -> dict[str, list]:
    """Schema, types, nulls, value ranges, label set, class balance, row counts and duplicates.

    Extra columns are allowed by default (sources often carry bookkeeping columns); only the
    declared columns are stored. Pass ``allow_extra_columns=False`` to refuse them.
    """
    import great_expectations as gx

    E = gx.expectations
    wanted = [*spec.feature_columns, spec.label_column, *([spec.id_column] if spec.id_column else [])]
    rows: list = [
        E.ExpectTableColumnsToMatchSet(column_set=wanted, exact_match=not allow_extra_columns),
        E.ExpectTableRowCountToBeBetween(min_value=min_rows, max_value=max_rows),
        E.ExpectColumnValuesToNotBeNull(column=spec.label_column),
        E.ExpectColumnValuesToBeInSet(column=spec.label_column, value_set=_label_values(spec.class_names)),
        E.ExpectCompoundColumnsToBeUnique(column_list=list(spec.feature_columns), mostly=0.99),
    ]
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
    classes = [E.ExpectColumnDistinctValuesToEqualSet(column="label", value_set=list(spec.class_names))]
    if min_class_share > 0:
        classes.append(E.ExpectColumnValuesToBeBetween(column="share", min_value=min_class_share, max_value=1.0))
    return {"rows": rows, "features": features, "classes": classes}


def standard_shard_expectations(
    spec: PipelineSpec, *, max_abs_feature: float = 1e3, max_fraction_error: float = 0.05,
) -> dict[str, list]:
    """Per-split counts and fractions, label set, finite features in a sane range, checksums."""
    import great_expectations as gx

    E = gx.expectations
    k = len(spec.class_names)
    samples = [
        E.ExpectColumnDistinctValuesToEqualSet(column="split", value_set=["train", "validation", "test"]),
        E.ExpectColumnValuesToBeBetween(column="label", min_value=0, max_value=k - 1),
        E.ExpectColumnDistinctValuesToEqualSet(column="train_label", value_set=list(range(k))),
        E.ExpectColumnValuesToBeInSet(column="finite", value_set=[True]),
        E.ExpectColumnValuesToBeBetween(column="max_abs", min_value=0, max_value=max_abs_feature),
    ]
    splits = [
        E.ExpectColumnValuesToBeBetween(column="num_samples", min_value=1),
        E.ExpectColumnValuesToBeBetween(column="fraction_error", min_value=0, max_value=max_fraction_error),
        E.ExpectColumnValuesToBeInSet(column="checksums_ok", value_set=[True]),
    ]
    return {"samples": samples, "splits": splits}
