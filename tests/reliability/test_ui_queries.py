"""The UI's own operations that the GraphQL load sends (tests/reliability/ui_queries/) still fit the
installed Dagster's schema: after an upgrade a stale copy fails here, in seconds, rather than as a
load run of errors in `make reliability`."""

from __future__ import annotations

import pytest
from graphql import parse, validate

from tests.reliability.graphql_load import UI_QUERIES, watching_a_model


@pytest.fixture(scope="module")
def schema():
    from dagster_graphql.schema import create_schema

    return create_schema().graphql_schema


@pytest.mark.parametrize("path", sorted(UI_QUERIES.glob("*.graphql")), ids=lambda p: p.stem)
def test_each_ui_operation_validates_against_the_schema(schema, path):
    document = parse(path.read_text())
    assert validate(schema, document) == []
    # The file is named after the one operation it holds, the name the load reports it by.
    assert [d.name.value for d in document.definitions if d.kind == "operation_definition"] == [path.stem]


def test_watching_a_model_sends_every_ui_operation_with_its_variables(schema):
    reads = watching_a_model("digits")
    assert sorted(r.name for r in reads) == sorted(p.stem for p in UI_QUERIES.glob("*.graphql"))
    for read in reads:
        operation = next(d for d in parse(read.query).definitions if d.kind == "operation_definition")
        required = {v.variable.name.value for v in operation.variable_definitions
                    if v.type.kind == "non_null_type" and v.default_value is None}
        assert required <= set(read.variables), f"{read.name} lacks {sorted(required - set(read.variables))}"
