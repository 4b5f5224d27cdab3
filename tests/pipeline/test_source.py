"""Source reading refuses data that training cannot use, naming the problem."""

import numpy as np
import pandas as pd
import pytest

from assets.source import SourceError, load_frame
from core.spec import PipelineSpec, Source


def _spec(**kw) -> PipelineSpec:
    args = dict(name="toy", source=Source(paths=("toy/*.csv",)), feature_columns=("a", "b"), label_column="y",
                class_names=("x", "z"), id_column="id")
    args.update(kw)
    return PipelineSpec(**args)


def _write(root, text: str, name="data.csv"):
    (root / "toy").mkdir(parents=True, exist_ok=True)
    (root / "toy" / name).write_text(text)


def test_reads_valid_csv(tmp_path):
    _write(tmp_path, "id,a,b,y\n1,0.5,1,x\n2,1.5,2,z\n")
    frame, described = load_frame(_spec(), tmp_path)
    assert list(frame.columns) == ["a", "b", "y", "id"]
    assert frame["a"].dtype == np.float32
    assert described[0]["file"] == "data.csv" and len(described[0]["sha256"]) == 64


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("id,a,b,y\n", "no rows"),
        ("id,a,y\n1,0.5,x\n", "lacks column"),
        ("id,a,b,y\n1,0.5,1,q\n", "outside the known classes"),
        ("id,a,b,y\n1,nan,1,x\n", "NaN"),
        ("id,a,b,y\n1,inf,1,x\n", "infinite"),
        ("id,a,b,y\n1,abc,1,x\n", "non-numeric"),
        ("id,a,b,y\n1,0.5,1,x\n1,0.7,1,z\n", "duplicate id"),
        ("id,a,b,y\n1,0.5,1,\n", "missing values"),
    ],
)
def test_bad_sources_are_refused_with_the_reason(tmp_path, text, message):
    _write(tmp_path, text)
    with pytest.raises(SourceError, match=message):
        load_frame(_spec(), tmp_path)


def test_missing_source_names_the_path(tmp_path):
    with pytest.raises(SourceError, match="matches no file"):
        load_frame(_spec(), tmp_path)


def test_parquet_and_csv_files_combine(tmp_path):
    (tmp_path / "toy").mkdir()
    pd.DataFrame({"id": ["1"], "a": [0.1], "b": [0.2], "y": ["x"]}).to_parquet(tmp_path / "toy" / "p.parquet")
    _write(tmp_path, "id,a,b,y\n2,0.5,1,z\n")
    spec = _spec(source=Source(paths=("toy/*.csv", "toy/*.parquet")))
    frame, _ = load_frame(spec, tmp_path)
    assert sorted(frame["id"]) == ["1", "2"]


def test_numeric_labels_match_text_class_names(tmp_path):
    _write(tmp_path, "id,a,b,y\n1,0.5,1,1\n2,1.5,2,0.0\n")
    frame, _ = load_frame(_spec(class_names=("0", "1")), tmp_path)
    assert sorted(frame["y"]) == ["0", "1"]


@pytest.mark.parametrize("arrow", [False, True])
def test_a_sources_chunks_are_each_files_chunks_in_turn(tmp_path, arrow):
    """No chunk spans two files, and a file's types come from it alone: what lets a file added to
    a source be ingested alone (assets/append.py)."""
    from assets.source import iter_file_chunks, iter_source_chunks

    (tmp_path / "toy").mkdir()
    files = [tmp_path / "toy" / n for n in ("a.csv", "b.parquet", "c.csv")]
    frames = [pd.DataFrame({"id": [f"{n}{i}" for i in range(k)], "a": np.arange(k) * 0.5, "b": np.arange(k),
                            "y": ["x", "z"] * (k // 2)}) for n, k in (("a", 10), ("b", 8), ("c", 6))]
    frames[2]["b"] = frames[2]["b"] + 0.5  # floats here, integers in the other files
    for path, frame in zip(files, frames):
        frame.to_parquet(path, index=False) if path.suffix == ".parquet" else frame.to_csv(path, index=False)
    spec = _spec()
    chunks = iter_source_chunks(spec, files, 4)
    whole = list(chunks.fast() if arrow else chunks)
    alone = [c for path in files for c in iter_file_chunks(spec, path, 4, arrow=arrow, fixed={})]
    assert [len(c) for c in whole] == [4, 4, 2, 4, 4, 4, 2]
    assert len(whole) == len(alone)
    for mine, theirs in zip(alone, whole):
        pd.testing.assert_frame_equal(mine, theirs)
