"""The raw suite run chunk by chunk gives the verdicts of the same suite on the whole frame."""

import great_expectations as gx
import numpy as np
import pandas as pd
import pytest

from assets.quality.chunked import ChunkedRawSuite, placement
from assets.quality.runner import run_suite
from core.expectations import standard_raw_expectations
from assets.quality.tables import raw_tables
from core.spec import PipelineSpec, Source

E = gx.expectations
FEATURES = ("f0", "f1", "f2")


def _spec() -> PipelineSpec:
    return PipelineSpec(name="t", source=Source(paths=("t.csv",)), feature_columns=FEATURES, label_column="label",
                        class_names=("0", "1", "2"), id_column="id")


def _suite() -> dict:
    suite = standard_raw_expectations(_spec(), min_rows=10, max_rows=1000, value_range=(0, 4), min_class_share=0.25)
    suite["rows"] += [E.ExpectColumnValuesToMatchRegex(column="id", regex=r"^r\d+$", mostly=0.99),
                      E.ExpectColumnMeanToBeBetween(column="f0", min_value=1.5, max_value=2.5)]
    return suite


def _frame(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.uniform(0, 4, size=(n, 3)).round(3), columns=list(FEATURES))
    frame["label"] = np.arange(n) % 3
    frame["id"] = [f"r{i}" for i in range(n)]
    return frame


def _defects(frame: pd.DataFrame) -> pd.DataFrame:
    """A few of each kind, spread over several chunks: a NaN, an out-of-range value, an unknown
    label, a duplicate id and a duplicate row in later chunks, ids that break the regex."""
    frame = frame.copy()
    frame.loc[[280, 290], list(FEATURES)] = frame.loc[[11, 12], list(FEATURES)].to_numpy()
    frame.loc[5, "f1"] = np.nan
    frame.loc[130, "f2"] = 99.0
    frame.loc[260, "label"] = 7
    frame.loc[250, "id"] = "r3"
    frame.loc[[70, 200], "id"] = ["x70", "x200"]
    return frame


def _by_check(report) -> dict:
    return {(o.table, o.expectation, repr(sorted(o.kwargs.items()))): o for o in report.outcomes}


def _chunked(frame: pd.DataFrame, rows: int):
    suite = ChunkedRawSuite("t/raw_dataset", _suite(), FEATURES, "label")
    for start in range(0, max(1, len(frame)), rows):
        suite.add(frame.iloc[start:start + rows])
    return suite.finish()


@pytest.mark.parametrize("rows", [1000, 64, 7])
@pytest.mark.parametrize("defective", [False, True])
def test_chunked_verdicts_and_counts_equal_the_whole_frame_run(rows, defective):
    frame = _defects(_frame()) if defective else _frame()
    whole = _by_check(run_suite("t/raw_dataset", _suite(), raw_tables(FEATURES, "label", frame)))
    chunked = _by_check(_chunked(frame, rows))
    assert chunked.keys() == whole.keys()
    for key, w in whole.items():
        c = chunked[key]
        assert c.success == w.success, (key, w.summary(), c.summary())
        assert c.unexpected_count == w.unexpected_count, (key, w.summary(), c.summary())
        assert c.columns == w.columns, key
        if w.expectation != "expect_compound_columns_to_be_unique":  # hashes stand for the rows there
            assert c.examples == w.examples[:5], key
            assert c.observed == w.observed, key
    assert any(not o.success for o in whole.values()) == defective


def test_duplicate_rows_in_different_chunks_fail_compound_uniqueness():
    frame = _frame(200)
    frame.loc[:, list(FEATURES)] = np.arange(600, dtype=float).reshape(200, 3) % 5 + np.arange(200)[:, None] * 10
    frame.loc[180, list(FEATURES)] = frame.loc[3, list(FEATURES)].to_numpy()
    suite = ChunkedRawSuite("t", {"rows": [E.ExpectCompoundColumnsToBeUnique(column_list=list(FEATURES))]},
                            FEATURES, "label")
    for start in range(0, 200, 50):
        suite.add(frame.iloc[start:start + 50])
    (outcome,) = suite.finish().outcomes
    assert not outcome.success and outcome.unexpected_count == 2
    assert outcome.expectation == "expect_compound_columns_to_be_unique"
    assert suite.key_table().shape == (200, 1)  # one hash per row, not the feature columns


def test_a_column_missing_from_one_chunk_fails_its_checks():
    # (stricter than one concatenated frame, where the column would exist, null in those rows)
    frame = _frame(100)
    suite = ChunkedRawSuite("t", {"rows": [E.ExpectTableColumnsToMatchSet(column_set=[*FEATURES, "label", "id"]),
                                           E.ExpectColumnValuesToBeUnique(column="id")]}, FEATURES, "label")
    suite.add(frame.iloc[:50])
    suite.add(frame.iloc[50:].drop(columns="id"))
    schema, unique = suite.finish().outcomes
    assert not schema.success and "id" not in schema.observed
    assert not unique.success  # GE's verdict on a key table without the column


def test_whole_table_checks_on_the_features_table_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="needs every cell of the source at once.*per-row expectation"):
        ChunkedRawSuite("t", {"features": [E.ExpectColumnMeanToBeBetween(column="value", min_value=0)]},
                        FEATURES, "label")


def test_an_empty_source_is_validated_like_an_empty_frame():
    empty = _frame(0)
    whole = _by_check(run_suite("t", _suite(), raw_tables(FEATURES, "label", empty)))
    chunked = _by_check(_chunked(empty, 64))
    assert {k: o.success for k, o in chunked.items()} == {k: o.success for k, o in whole.items()}


def test_placement_of_standard_checks():
    assert placement(E.ExpectColumnValuesToBeBetween(column="value", min_value=0)) == "map"
    assert placement(E.ExpectTableColumnsToMatchSet(column_set=["a"])) == "schema"
    for e in (E.ExpectColumnValuesToBeUnique(column="id"), E.ExpectTableRowCountToBeBetween(min_value=1),
              E.ExpectCompoundColumnsToBeUnique(column_list=["a", "b"]), E.ExpectColumnMeanToBeBetween(column="a")):
        assert placement(e) == "whole"


def test_batches_are_not_fingerprinted(monkeypatch):
    # GE would md5 every cell of each batch for metadata the platform never reads
    from great_expectations.execution_engine import pandas_execution_engine

    def refuse(df):
        raise AssertionError("GE fingerprinted a batch")

    monkeypatch.setattr(pandas_execution_engine, "hash_pandas_dataframe", refuse)
    report = _chunked(_frame(), 100)
    assert report.passed
