"""The raw stage in chunks: sources read piecewise, the platform's rules across chunks, the Parquet
copy, and shards built from batches equal to shards built from the whole frame."""

import json

import numpy as np
import pandas as pd
import pytest

from assets.ingest import ingest_chunks, iter_raw_arrays, read_raw
from assets.sharding import build_shards, build_shards_from_chunks
from assets.source import SourceError, iter_frame_chunks, iter_source_chunks, validate_frame
from core.spec import PipelineSpec, Source, Split

FEATURES = tuple(f"f{i}" for i in range(5))


def _spec(id_column: str | None = "id", **source) -> PipelineSpec:
    return PipelineSpec(name="toy", source=Source(paths=("toy.csv",), **source), feature_columns=FEATURES,
                        label_column="y", class_names=("a", "b", "c"), id_column=id_column,
                        split=Split(seed=3, samples_per_shard=40))


def _frame(n: int = 500) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(3, 2, size=(n, len(FEATURES))), columns=list(FEATURES))
    frame["y"] = np.array(["a", "b", "c"])[np.arange(n) % 3]
    frame["id"] = [f"s{(i * 7919) % 100_003}" for i in range(n)]  # not in sorted order
    return frame


def test_csv_and_parquet_are_read_in_chunks_of_at_most_the_given_rows(tmp_path):
    frame = _frame(103)
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_parquet(tmp_path / "b.parquet", index=False)
    (tmp_path / "header.csv").write_text("id,f0\n")
    chunks = list(iter_source_chunks(_spec(), [tmp_path / "a.csv", tmp_path / "b.parquet", tmp_path / "header.csv"],
                                     25))
    assert [len(c) for c in chunks] == [25, 25, 25, 25, 3] * 2 + [0]
    assert list(chunks[-1].columns) == ["id", "f0"]  # a header-only file still shows its columns
    pd.testing.assert_frame_equal(pd.concat(chunks[:5], ignore_index=True), frame, check_dtype=False)
    assert [len(c) for c in iter_frame_chunks(frame, 50)] == [50, 50, 3]
    assert [len(c) for c in iter_frame_chunks(frame.iloc[:0], 50)] == [0]


def test_a_file_that_breaks_mid_way_is_a_source_error(tmp_path):
    good = _frame(60).to_csv(index=False)
    (tmp_path / "bad.csv").write_text(good + "1,2,3\n" + "x," * 30 + "\n")
    with pytest.raises(SourceError, match="bad.csv.*cannot be parsed"):
        list(iter_source_chunks(_spec(), [tmp_path / "bad.csv"], 10))


@pytest.mark.parametrize("rows", [7, 64, 10_000])
def test_ingest_writes_the_validated_rows_whatever_the_chunk_size(tmp_path, rows):
    frame = _frame()
    ingested = ingest_chunks(_spec(), "toy/raw_dataset", None, iter_frame_chunks(frame, rows), tmp_path / "raw.parquet")
    assert ingested.report.passed and ingested.rows == 500 and ingested.columns == 7
    pd.testing.assert_frame_equal(read_raw(_spec(), ingested.path), validate_frame(_spec(), frame),
                                  check_dtype=False)  # str columns: object or pandas' str dtype
    stored = pd.read_parquet(ingested.path)  # what a user reading the copy sees
    assert list(stored.columns) == ["id", "y", "features"]
    np.testing.assert_array_equal(np.stack(stored["features"]), frame[list(FEATURES)].to_numpy(np.float32))


def test_an_id_repeated_in_a_later_chunk_fails_the_ingest(tmp_path):
    frame = _frame()
    frame.loc[450, "id"] = frame.loc[2, "id"]
    ingested = ingest_chunks(_spec(), "toy/raw_dataset", None, iter_frame_chunks(frame, 100), tmp_path / "raw.parquet")
    assert not ingested.report.passed
    assert f"1 duplicate id(s), e.g. {frame.loc[2, 'id']!r}" in ingested.report.failures[0]


def test_a_chunk_the_rules_refuse_stops_the_copy_but_not_the_suite(tmp_path):
    import great_expectations as gx

    frame = _frame()
    frame.loc[320, "y"] = "zebra"
    suite = {"rows": [gx.expectations.ExpectTableRowCountToBeBetween(min_value=1, max_value=100)]}
    ingested = ingest_chunks(_spec(), "toy/raw_dataset", suite, iter_frame_chunks(frame, 100), tmp_path / "raw.parquet")
    assert ingested.rows == 500
    assert "outside the known classes" in ingested.report.failures[0]
    assert "observed 500" in ingested.report.failures[1]  # the suite saw every chunk
    assert len(read_raw(_spec(), ingested.path)) == 300  # chunks before the bad one; never published


def test_header_only_source_is_refused(tmp_path):
    ingested = ingest_chunks(_spec(), "toy/raw_dataset", None, iter_frame_chunks(_frame(0), 10),
                             tmp_path / "raw.parquet")
    assert "the source has no rows" in ingested.report.failures[0]


@pytest.mark.parametrize("id_column", ["id", None])
@pytest.mark.parametrize("rows", [1, 33, 10_000])
def test_shards_from_parquet_batches_equal_shards_from_the_whole_frame(tmp_path, rows, id_column):
    spec = _spec(id_column)
    frame = _frame()
    if id_column is None:
        frame = frame.drop(columns="id")
    ingested = ingest_chunks(spec, "toy/raw_dataset", None, iter_frame_chunks(frame, 50), tmp_path / "raw.parquet")
    args = dict(feature_columns=FEATURES, label_column="y", class_names=spec.class_names, id_column=id_column,
                feature_shape=(5,), seed=3, fractions=(0.8, 0.1, 0.1), samples_per_shard=40)
    whole = build_shards(validate_frame(spec, frame), out_dir=tmp_path / "whole", **args)
    chunked = build_shards_from_chunks(iter_raw_arrays(spec, ingested.path, rows), out_dir=tmp_path / "chunked",
                                       block_rows=rows, **args)
    assert json.dumps(chunked, sort_keys=True) == json.dumps(whole, sort_keys=True)
    for split in chunked["splits"].values():
        for entry in split["shards"]:
            assert (tmp_path / "chunked" / entry["path"]).read_bytes() == (tmp_path / "whole" / entry["path"]).read_bytes()
    assert not list((tmp_path / "chunked").glob(".*"))  # the scratch file is gone


def test_shards_do_not_depend_on_source_row_order(tmp_path):
    spec = _spec()
    frame = validate_frame(spec, _frame())
    args = dict(feature_columns=FEATURES, label_column="y", class_names=spec.class_names, id_column="id",
                feature_shape=(5,), seed=3, fractions=(0.8, 0.1, 0.1), samples_per_shard=40)
    a = build_shards(frame, out_dir=tmp_path / "a", **args)
    b = build_shards(frame.sample(frac=1.0, random_state=1), out_dir=tmp_path / "b", **args)
    assert a == b


def test_a_raw_copy_of_other_features_is_refused_not_misread(tmp_path):
    ingested = ingest_chunks(_spec(), "toy/raw_dataset", None, iter_frame_chunks(_frame(20), 10), tmp_path / "r.parquet")
    other = PipelineSpec(name="toy", source=Source(paths=("toy.csv",)), feature_columns=FEATURES[::-1],
                         label_column="y", class_names=("a", "b", "c"), id_column="id")
    with pytest.raises(ValueError, match="re-materialise the raw dataset"):
        next(iter_raw_arrays(other, ingested.path, 10))  # raised by the reader, handed over by its thread
