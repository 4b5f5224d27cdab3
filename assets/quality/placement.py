"""Where an expectation's verdict can be computed from parts of a table: one row at a time
(``map``), from the schema (``schema``), or only from the whole table (``whole``). The chunked raw
suite (assets/quality/chunked.py) and the shard checks of kept parts (assets/quality/tables.py)
both ask."""

from __future__ import annotations

from typing import Any

# Map expectations whose verdict on a row depends on other rows.
_WHOLE_TABLE_MAPS = {
    "expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique",
    "expect_multicolumn_values_to_be_unique", "expect_column_values_to_be_increasing",
    "expect_column_values_to_be_decreasing", "expect_column_value_z_scores_to_be_less_than",
    "expect_column_values_to_not_be_outliers",
}
_SCHEMA = {
    "expect_column_to_exist", "expect_column_type_to_be", "expect_table_column_count_to_equal",
    "expect_table_column_count_to_be_between", "expect_table_columns_to_match_ordered_list",
    "expect_table_columns_to_match_set",
}


def placement(expectation: Any) -> str:
    """``"map"``, ``"schema"`` (both per chunk) or ``"whole"`` (once, on the key table)."""
    from great_expectations.expectations.expectation import (
        ColumnMapExpectation,
        ColumnPairMapExpectation,
        MulticolumnMapExpectation,
    )

    kind = expectation.expectation_type
    if kind in _SCHEMA:
        return "schema"
    if kind not in _WHOLE_TABLE_MAPS and isinstance(
            expectation, (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)):
        return "map"
    return "whole"
