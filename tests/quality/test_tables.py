"""The tables the raw suite sees: one (column, value) row per declared feature cell."""

import numpy as np
import pandas as pd

from assets.quality.tables import raw_tables


def test_the_features_table_names_each_cells_column():
    frame = pd.DataFrame({"id": ["a", "b", "c"], "f1": [1.0, 2.0, np.nan], "f0": [3, 4, 5],
                          "extra": ["x", "y", "z"], "label": ["0", "1", "0"]})
    features = raw_tables(("f0", "f1", "missing"), "label", frame)["features"]
    expected = frame[["f0", "f1"]].melt(var_name="column", value_name="value")
    assert list(features["column"].astype(str)) == list(expected["column"])
    assert list(features["column"].cat.categories) == ["f0", "f1"]
    pd.testing.assert_series_equal(features["value"], expected["value"])
    assert features.loc[features["value"].isna(), "column"].tolist() == ["f1"]


def test_an_empty_source_gives_an_empty_features_table():
    frame = pd.DataFrame({"f0": pd.Series(dtype="float64"), "label": pd.Series(dtype=str)})
    assert raw_tables(("f0",), "label", frame)["features"].empty
