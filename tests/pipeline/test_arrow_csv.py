"""The raw asset's Arrow CSV reader gives the frames pandas' reader gives, says when it would not,
and the ingest then reads the source again with pandas: the report and the Parquet copy are
the same either way."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from assets import arrow_csv
from assets.arrow_csv import ArrowFallback, arrow_frames
from assets.ingest import ingest_chunks
from assets.source import iter_source_chunks
from core.expectations import standard_raw_expectations
from core.spec import PipelineSpec, Source, Split

FEATURES = ("f0", "f1", "f2")


def _spec(**source) -> PipelineSpec:
    return PipelineSpec(name="toy", source=Source(paths=("toy.csv",), **source), feature_columns=FEATURES,
                        label_column="y", class_names=("a", "b", "c"), id_column="id",
                        split=Split(seed=3, samples_per_shard=40))


def _rows(n: int, feature=lambda i: f"{i * 0.5},{i},{-i}e-3", label=lambda i: "abc"[i % 3], extra="") -> str:
    head = "id,f0,f1,f2,y" + ("," + extra if extra else "")
    return head + "\n" + "".join(f"s{i:04d},{feature(i)},{label(i)}{',x' + str(i) if extra else ''}\n"
                                 for i in range(n))


SAME = {
    "numbers and text": _rows(50),
    "integer labels": _rows(50, label=lambda i: str(i % 3)),
    "quoted values with commas, quotes and line ends": 'id,f0,f1,f2,y,note\n' + "".join(
        f's{i},{i},{i},{i},a,"x, ""y""\nz"\n' for i in range(30)),
    "missing values and an empty column": "id,f0,f1,f2,y,extra\n" + "".join(
        f"s{i},{i},{'' if i % 7 else 'NA'},{i},b,\n" for i in range(50)),
    "CRLF line ends": _rows(20).replace("\n", "\r\n"),
}


@pytest.mark.parametrize("case", sorted(SAME))
def test_arrow_frames_equal_pandas_chunks(tmp_path, case):
    path = tmp_path / "toy.csv"
    path.write_bytes(SAME[case].encode())
    pandas_chunks = list(iter_source_chunks(_spec(), [path], 7))
    arrow_chunks = list(arrow_frames(_spec(), path, 7))
    assert [len(c) for c in arrow_chunks] == [len(c) for c in pandas_chunks]
    for ours, theirs in zip(arrow_chunks, pandas_chunks):
        pd.testing.assert_frame_equal(ours, theirs.reset_index(drop=True))


def test_pieces_end_at_line_ends_outside_quotes(tmp_path, monkeypatch):
    """Pieces far smaller than a row's text: every cut falls at a line end that no quote spans."""
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", 16)
    path = tmp_path / "toy.csv"
    path.write_bytes(SAME["quoted values with commas, quotes and line ends"].encode())
    frames = list(arrow_frames(_spec(), path, 1000))
    assert len(frames) == 1 and len(frames[0]) == 30
    assert set(frames[0]["note"]) == {'x, "y"\nz'}


@pytest.mark.parametrize("text, reason", [
    (_rows(50, feature=lambda i: f"{'oops' if i == 45 else i},{i},{i}"), "do not read as numbers"),
    ("id,f0,f1,f2,y,day\n" + "".join(f"s{i},{i},{i},{i},a,2024-01-0{i % 9 + 1}\n" for i in range(9)),
     "types pandas does not infer"),
    ("id,f0,f0,f2,y\ns1,1,2,3,a\n", "duplicate or empty column names"),
    ("id,f0,f1,f2,y\n", "no rows"),
    ("id,f0,f1,f2,y\n1.5,1,2,3,a\n", "reads as floats"),
])
def test_what_arrow_would_read_otherwise_is_refused_before_any_chunk(tmp_path, text, reason):
    path = tmp_path / "toy.csv"
    path.write_text(text)
    with pytest.raises(ArrowFallback, match=reason):
        next(arrow_frames(_spec(), path, 7))


def test_a_later_piece_that_no_longer_fits_the_first_ones_types_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", 256)  # the bad row lies in a later piece
    path = tmp_path / "toy.csv"
    path.write_text(_rows(80, feature=lambda i: f"{'oops' if i == 70 else i},{i},{i}"))
    with pytest.raises(ArrowFallback, match="invalid value 'oops'"):
        list(arrow_frames(_spec(), path, 7))


@pytest.mark.parametrize("text", [
    _rows(200),
    _rows(200, feature=lambda i: f"{'oops' if i == 150 else i},{i},{i}"),  # refused mid-way: pandas reads it
    _rows(200, label=lambda i: "zebra" if i == 120 else "abc"[i % 3]),  # a rule refuses a chunk
])
def test_ingest_reports_and_stores_the_same_with_either_reader(tmp_path, monkeypatch, text):
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", 1024)
    path = tmp_path / "toy.csv"
    path.write_text(text)
    spec = _spec()
    fast = ingest_chunks(spec, "toy/raw_dataset", standard_raw_expectations(spec), iter_source_chunks(spec, [path], 64),
                         tmp_path / "a.parquet")
    slow = ingest_chunks(spec, "toy/raw_dataset", standard_raw_expectations(spec),
                         iter(iter_source_chunks(spec, [path], 64)), tmp_path / "b.parquet")
    assert slow.reader == "pandas"
    assert fast.reader.startswith("pandas (toy.csv: ") if "oops" in text else fast.reader == "arrow"
    assert fast.report.summary() == slow.report.summary() and fast.rows == slow.rows == 200
    assert [vars(o) for o in fast.report.outcomes] == [vars(o) for o in slow.report.outcomes]
    assert pq.read_table(fast.path).equals(pq.read_table(slow.path))


def test_pandas_csv_options_keep_pandas_reader(tmp_path):
    path = tmp_path / "toy.csv"
    path.write_text(_rows(20).replace(",", ";"))
    spec = _spec(csv_options={"sep": ";"})
    ingested = ingest_chunks(spec, "toy/raw_dataset", None, iter_source_chunks(spec, [path], 64), tmp_path / "r.parquet")
    assert ingested.reader == "pandas" and ingested.report.passed
    assert np.array_equal(np.stack(pq.read_table(path.with_name("r.parquet"))["features"].to_numpy(
        zero_copy_only=False))[:, 1], np.arange(20, dtype=np.float32))
