"""A CSV source grown by appended rows (issue 41, item 3): the raw asset parses and checks only
the new rows when it can prove they were appended to the published version's file
(assets/append.py), and the version it makes is the one a build from nothing makes, byte for
byte; anything it cannot prove is read whole, and the log says why."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from assets import arrow_csv
from tests.pipeline.conftest import failure_messages

FEATURES = [f"f{i}" for i in range(4)]
PIECE = 4096  # Arrow's pieces this small, so a test's CSV holds several


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", PIECE)


def _frame(ids: range, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed + ids.start)
    frame = pd.DataFrame(rng.normal(size=(len(ids), len(FEATURES))).round(4), columns=FEATURES)
    frame["label"] = [i % 3 for i in ids]
    frame["id"] = [f"row-{i:06d}" for i in ids]
    return frame


def _spec(name: str, path: str, **kw):
    from pipelines.api import Source, dataset_pipeline

    # 0.005 MB chunks: 109 rows a chunk, so the published rows end inside a chunk
    return dataset_pipeline(name, source=Source(paths=(path,), chunk_mb=0.005), features=FEATURES, label="label",
                            classes=range(3), id_column="id", split={"seed": 7, "samples_per_shard": 64}, **kw)


def _write(platform, rel: str, frame: pd.DataFrame, mode: str = "w") -> None:
    path = platform.sources / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as f:
        frame.to_csv(f, index=False, header=mode == "w")


def _said(platform, result, needle: str) -> list[str]:
    return [e.message for e in platform.instance.all_logs(result.run_id) if needle in (e.message or "")]


def _published(platform, name: str, path: str) -> bytes:
    return platform.store().get_object("main", f"datasets/{name}/{path}")


def _shards(platform, name: str) -> dict[str, bytes]:
    store = platform.store()
    prefix = f"datasets/{name}/shards/"
    manifest = json.loads(store.get_object("main", prefix + "manifest.json"))
    files = {e["path"]: store.get_object("main", prefix + e["path"]) for i in manifest["splits"].values()
             for e in i["shards"]}
    return {"manifest.splits": json.dumps(manifest["splits"], sort_keys=True).encode(), **files}


def _grow(platform, spec, rel: str, added: pd.DataFrame):
    """The first version on ``_frame(range(2000))``, then ``added`` appended to the file and a second run."""
    _write(platform, rel, _frame(range(2000)))
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    _write(platform, rel, added, mode="a")
    return platform.run(spec)


def test_an_appended_csv_ingests_only_its_new_rows_and_equals_a_build_from_nothing(platform):
    spec = _spec("ledger", "ledger/table.csv")
    second = _grow(platform, spec, "ledger/table.csv", _frame(range(2000, 2030)))
    assert second.success, failure_messages(second)
    said = _said(platform, second, "appended to the published version's")
    assert said == ["ledger: appended to the published version's 2000 row(s): 30 new row(s) of table.csv (bytes "
                    f"{len(_frame(range(2000)).to_csv(index=False))} on) parsed and checked, the raw suite judged on "
                    "every row from the published sums and key table"]

    # the same grown file, as a new dataset's first version: everything read
    (platform.sources / "whole").mkdir()
    shutil.copyfile(platform.sources / "ledger/table.csv", platform.sources / "whole/table.csv")
    whole = _spec("whole", "whole/table.csv")
    built = platform.run(whole)
    assert built.success, failure_messages(built)
    assert _said(platform, built, "every row read (2030): no published version to build on")
    assert _published(platform, "ledger", "raw/data.parquet") == _published(platform, "whole", "raw/data.parquet")
    assert _published(platform, "ledger", "raw/keys.parquet") == _published(platform, "whole", "raw/keys.parquet")
    mine, theirs = (json.loads(_published(platform, n, "raw/ingest.json")) for n in ("ledger", "whole"))
    assert {k: v for k, v in mine.items() if k != "parameters"} == {k: v for k, v in theirs.items() if k != "parameters"}
    assert _shards(platform, "ledger") == _shards(platform, "whole")

    # and a second append builds on the first one's record
    _write(platform, "ledger/table.csv", _frame(range(2030, 2100)), mode="a")
    third = platform.run(spec)
    assert third.success, failure_messages(third)
    assert _said(platform, third, "appended to the published version's 2030 row(s): 70 new row(s)")


@pytest.mark.parametrize("change, why", [
    ("edit", "first {size} bytes are not the published file's: edited, not appended"),
    ("header", "first {size} bytes are not the published file's: edited, not appended"),
    ("uncastable", "an appended row does not parse with the published version's column types"),
])
def test_what_is_not_a_provable_append_is_read_whole_saying_why(platform, change, why):
    spec = _spec("ledger", "ledger/table.csv")
    _write(platform, "ledger/table.csv", _frame(range(2000)))
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    why = why.format(size=(platform.sources / "ledger/table.csv").stat().st_size)
    grown = _frame(range(2030))
    if change == "edit":
        grown.loc[5, "f1"] = 0.5
    elif change == "header":
        grown = grown.rename(columns={"f3": "f3b"}).assign(f3=grown["f3"])  # a column more, same order after
    else:
        grown = grown.astype({"f2": object})
        grown.loc[2010, "f2"] = "abc"
    _write(platform, "ledger/table.csv", grown)
    second = platform.run(spec)
    said = _said(platform, second, "every row read (2030)")
    assert len(said) == 1 and why in said[0], said
    if change == "uncastable":  # read whole by pandas, whose chunks show the value to the rules
        assert not second.success and "non-numeric" in failure_messages(second)
    else:
        assert second.success, failure_messages(second)


def test_a_duplicate_of_an_old_id_in_the_appended_rows_fails_the_raw_gate(platform):
    spec = _spec("ledger", "ledger/table.csv")
    added = _frame(range(2000, 2010))
    added.loc[3, "id"] = "row-000004"
    second = _grow(platform, spec, "ledger/table.csv", added)
    assert _said(platform, second, "appended to the published version's")
    assert not second.success
    assert "id column 'id' has 1 duplicate id(s), e.g. 'row-000004'" in failure_messages(second)


def test_a_bad_value_in_the_appended_rows_fails_the_raw_gate(platform):
    spec = _spec("ledger", "ledger/table.csv")
    added = _frame(range(2000, 2010))
    added.loc[2, "label"] = 7  # outside the classes: the suite's value set and the platform's rule refuse it
    second = _grow(platform, spec, "ledger/table.csv", added)
    assert _said(platform, second, "appended to the published version's")
    assert not second.success
    assert "expect_column_values_to_be_in_set" in failure_messages(second)


def test_appended_rows_that_would_change_the_last_chunks_dtypes_are_read_whole(platform):
    """A missing label in the rows that complete the published version's last chunk turns that
    chunk's int64 labels to float64 in a whole parse: the per-chunk checks would see other values,
    so every row is read, and the missing label fails the gate as it always did."""
    spec = _spec("ledger", "ledger/table.csv")
    added = _frame(range(2000, 2010)).astype({"label": "Int64"})
    added.loc[1, "label"] = None
    second = _grow(platform, spec, "ledger/table.csv", added)
    said = _said(platform, second, "every row read (2010)")
    assert len(said) == 1 and "would change the dtypes of the chunk they complete ({'label': 'int64 -> float64'})" \
        in said[0], said
    assert not second.success and "label column 'label' has missing values" in failure_messages(second)


def test_only_the_last_file_may_grow(platform):
    spec = _spec("ledger", "ledger/*.csv")
    _write(platform, "ledger/a.csv", _frame(range(1000)))
    _write(platform, "ledger/b.csv", _frame(range(1000, 2000)))
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    _write(platform, "ledger/b.csv", _frame(range(2000, 2010)), mode="a")
    second = platform.run(spec)
    assert second.success, failure_messages(second)
    assert _said(platform, second, "appended to the published version's 2000 row(s): 10 new row(s) of b.csv")

    _write(platform, "ledger/a.csv", _frame(range(2010, 2020)), mode="a")
    third = platform.run(spec)
    assert third.success, failure_messages(third)
    said = _said(platform, third, "every row read (2020): a.csv changed since the published version")
    assert len(said) == 1 and "only the last published file may grow, and only by appended rows" in said[0], said


@pytest.mark.parametrize("pieces, why", [
    ((1 << 20, 1 << 20), "table.csv held less than one Arrow piece (1048576 bytes) when published"),
    ((2048, PIECE), "Arrow's pieces are 4096 bytes now, 2048 when published"),
])
def test_an_append_whose_types_a_whole_parse_may_infer_otherwise_is_read_whole(platform, monkeypatch, pieces, why):
    """Arrow fixes the types from a file's first piece: when that piece would hold new rows (the
    file, about 85 kB, was smaller than a piece) or pieces are cut otherwise, nothing proves that
    the appended rows parse as a whole parse would parse them."""
    spec = _spec("ledger", "ledger/table.csv")
    _write(platform, "ledger/table.csv", _frame(range(2000)))
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", pieces[0])
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", pieces[1])
    _write(platform, "ledger/table.csv", _frame(range(2000, 2010)), mode="a")
    second = platform.run(spec)
    assert second.success, failure_messages(second)
    said = _said(platform, second, "every row read (2010)")
    assert len(said) == 1 and why in said[0], said
