"""A table source that grows by new files (issue 41, item 3): a folder of daily CSV or Parquet
files is ingested by the new files' rows alone (assets/append.py), and the raw copy, its key
table, its ingest record and the raw suite's report are a full ingest's of the grown source, byte
for byte; a published file removed, moved or changed, or a new file of another schema, is read
whole, and the log says which file and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from assets import append, arrow_csv, ingest
from assets.data_key import data_key
from assets.source import file_sha256, iter_source_chunks
from core.datasets import dataset_tags
from tests.pipeline.conftest import failure_messages

FEATURES = [f"f{i}" for i in range(4)]
PIECE = 4096  # Arrow's pieces this small, so a test's CSV holds several


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", PIECE)


def _frame(ids: range) -> pd.DataFrame:
    rng = np.random.default_rng(ids.start)
    frame = pd.DataFrame(rng.normal(size=(len(ids), len(FEATURES))).round(4), columns=FEATURES)
    frame["label"] = [i % 3 for i in ids]
    frame["id"] = [f"row-{i:06d}" for i in ids]
    return frame


def _spec(name: str, pattern: str):
    from pipelines.api import Source, dataset_pipeline

    # 0.005 MB chunks: 109 rows a chunk, so every file ends inside a chunk
    return dataset_pipeline(name, source=Source(paths=(pattern,), chunk_mb=0.005), features=FEATURES, label="label",
                            classes=range(3), id_column="id", split={"seed": 7, "samples_per_shard": 64})


def _write(folder: Path, name: str, frame: pd.DataFrame, mode: str = "w") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        with open(path, mode) as f:
            frame.to_csv(f, index=False, header=mode == "w")
    return path


def _ingest(spec, files: list[Path], tmp: Path, published: append.Published | None = None) -> ingest.Ingested:
    """The raw asset's ingest of ``files`` into ``tmp``, as assets/pipeline.py calls it."""
    tmp.mkdir(parents=True)
    key = data_key(spec, [{"file": f.name, "bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in files])
    return append.ingest_source(spec, f"{spec.name}/raw_dataset", spec.expectations.raw(spec),
                                iter_source_chunks(spec, files, spec.chunk_rows), tmp / "data.parquet", key=key,
                                published=published)


def _published(spec, done: ingest.Ingested) -> append.Published:
    """``done`` as the store hands it to the next version: the record through JSON, the files copied."""
    assert done.report.passed and done.keys is not None, done.report.failures
    stored = {ingest.raw_path(spec.name): done.path, ingest.keys_path(spec.name): done.keys}
    return append.Published(record=json.loads(json.dumps(done.record, sort_keys=True)),
                            fetch=lambda path, dest: Path(shutil.copyfile(stored[path], dest)))


def _grow(spec, tmp: Path, v1: list[Path], v2: list[Path]) -> tuple[ingest.Ingested, ingest.Ingested]:
    """(v2 ingested on v1's record, v2 ingested from nothing)."""
    first = _ingest(spec, v1, tmp / "v1")
    return _ingest(spec, v2, tmp / "v2", _published(spec, first)), _ingest(spec, v2, tmp / "whole")


def _assert_a_full_ingests(grown: ingest.Ingested, whole: ingest.Ingested) -> None:
    assert grown.report.passed and whole.report.passed, whole.report.failures
    assert grown.path.read_bytes() == whole.path.read_bytes()
    assert grown.keys.read_bytes() == whole.keys.read_bytes()
    assert json.dumps(grown.record, sort_keys=True) == json.dumps(whole.record, sort_keys=True)
    assert grown.report.to_json() == whole.report.to_json()
    assert (grown.rows, grown.columns, grown.reader) == (whole.rows, whole.columns, whole.reader)


@pytest.mark.parametrize("suffixes", [(".csv", ".csv"), (".parquet", ".parquet"), (".csv", ".parquet"),
                                      (".parquet", ".csv")])
def test_new_files_are_ingested_alone_and_equal_a_full_ingest(tmp_path, suffixes):
    old, new = suffixes
    spec = _spec("daily", "daily/*")
    days = tmp_path / "daily"
    v1 = [_write(days, f"2026-12-0{d}{old}", _frame(range(d * 1000, d * 1000 + 300 + d))) for d in (1, 2, 3)]
    v2 = v1 + [_write(days, f"2026-12-0{d}{new}", _frame(range(d * 1000, d * 1000 + 250 + d))) for d in (4, 5)]
    grown, whole = _grow(spec, tmp_path, v1, v2)
    assert grown.how == ("appended to the published version's 906 row(s): 509 new row(s) of the new file(s) "
                         f"2026-12-04{new}, 2026-12-05{new} parsed and checked, the raw suite judged on every row "
                         "from the published sums and key table")
    assert whole.how == "every row read (1415): no published version to build on"
    _assert_a_full_ingests(grown, whole)
    # the raw copy: a row group per chunk, no chunk spanning two files
    import pyarrow.parquet as pq

    groups = pq.ParquetFile(grown.path).metadata
    assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == \
        [n for d in (1, 2, 3, 4, 5) for n in _cuts((300 if d < 4 else 250) + d)]


def _cuts(rows: int, chunk: int = 109) -> list[int]:
    return [min(chunk, rows - s) for s in range(0, rows, chunk)]


def test_a_grown_last_csv_and_new_files_after_it_are_ingested_alone(tmp_path):
    spec = _spec("daily", "daily/*")
    days = tmp_path / "daily"
    v1 = [_write(days, "a.csv", _frame(range(0, 400))), _write(days, "b.csv", _frame(range(1000, 1500)))]
    first = _ingest(spec, v1, tmp_path / "v1")
    _write(days, "b.csv", _frame(range(1500, 1540)), mode="a")
    v2 = v1 + [_write(days, "c.csv", _frame(range(2000, 2120))), _write(days, "d.parquet", _frame(range(3000, 3010)))]
    grown = _ingest(spec, v2, tmp_path / "v2", _published(spec, first))
    whole = _ingest(spec, v2, tmp_path / "whole")
    assert grown.how.startswith(f"appended to the published version's 900 row(s): 170 new row(s) of b.csv (bytes "
                                f"{len(_frame(range(1000, 1500)).to_csv(index=False))} on) and the new file(s) c.csv, "
                                "d.parquet parsed and checked")
    _assert_a_full_ingests(grown, whole)
    assert grown.record["not_growable"] == "d.parquet is not a CSV file Arrow read"

    # the next version builds on that record: another day's file
    v3 = v2 + [_write(days, "e.parquet", _frame(range(4000, 4100)))]
    third = _ingest(spec, v3, tmp_path / "v3", _published(spec, grown))
    assert third.how.startswith("appended to the published version's 1070 row(s): 100 new row(s) of the new file(s) "
                                "e.parquet parsed")
    _assert_a_full_ingests(third, _ingest(spec, v3, tmp_path / "whole3"))


def _two_days(tmp_path: Path) -> tuple[object, Path, list[Path], append.Published]:
    spec = _spec("daily", "daily/*")
    days = tmp_path / "daily"
    v1 = [_write(days, "b.csv", _frame(range(0, 300))), _write(days, "c.csv", _frame(range(1000, 1300)))]
    return spec, days, v1, _published(spec, _ingest(spec, v1, tmp_path / "v1"))


@pytest.mark.parametrize("change, why", [
    ("changed", "b.csv changed since the published version (", ),
    ("removed", "c.csv was published but is not in the source now (removed or renamed)"),
    ("renamed", "b.csv was published but is not in the source now (removed or renamed)"),
    ("reordered", "c.csv is file 1 of the source now, file 2 when published: the files were reordered"),
    ("before", "the new file a.csv comes before the published b.csv in the source's order"),
    ("edited last", "c.csv's first {size} bytes are not the published file's: edited, not appended"),
    ("columns", "the new file d.csv has other columns or dtypes than the published rows (columns [] missing, "
                "['extra'] new): a changed schema is read whole"),
    ("dtypes", "the new file d.parquet has other columns or dtypes than the published rows ({'label': "
               "'int64 -> float64'}): a changed schema is read whole"),
    ("text feature", "the new file d.csv does not parse with Arrow as pandas would, so a full ingest reads every "
                     "file with pandas: d.csv: feature column(s) ['f1'] do not read as numbers"),
])
def test_what_is_not_a_growth_by_new_files_is_read_whole_saying_which_file_and_why(tmp_path, change, why):
    spec, days, files, published = _two_days(tmp_path)
    why = why.replace("{size}", str(files[1].stat().st_size))
    later = _frame(range(2000, 2200))
    if change == "changed":
        _write(days, "b.csv", _frame(range(0, 300)).assign(f1=0.5))
        files = files + [_write(days, "d.csv", later)]
    elif change == "removed":
        files = files[:1] + [_write(days, "d.csv", later)]
    elif change == "renamed":
        files = [files[0].rename(days / "b2.csv"), files[1]]
    elif change == "reordered":  # as two source paths listing them the other way would
        files = [files[1], files[0], _write(days, "d.csv", later)]
    elif change == "before":
        files = [_write(days, "a.csv", later)] + files
    elif change == "edited last":
        _write(days, "c.csv", pd.concat([_frame(range(1000, 1300)), _frame(range(1300, 1400))]).assign(f2=1.0))
        files = files + [_write(days, "d.csv", later)]
    elif change == "columns":
        files = files + [_write(days, "d.csv", later.assign(extra=1))]
    elif change == "dtypes":  # one missing label turns the column to float64
        files = files + [_write(days, "d.parquet", later.astype({"label": float}).assign(
            label=lambda f: f["label"].where(f.index != 7)))]
    else:
        files = files + [_write(days, "d.csv", later.astype({"f1": object}).assign(f1="abc"))]
    done = _ingest(spec, files, tmp_path / "v2", published)
    assert done.how.startswith(f"every row read ({done.rows}): ") and why in done.how, done.how
    if change in ("dtypes", "text feature"):  # read whole, the bad rows fail the gate as in any full ingest
        assert not done.report.passed
        whole = _ingest(spec, files, tmp_path / "whole")
        assert done.report.to_json() == whole.report.to_json()
    elif change != "columns":
        assert done.report.passed, done.report.failures


def test_a_version_read_by_pandas_is_built_on_by_new_files(tmp_path):
    """Arrow falls back to pandas on a published file (a date column): a full ingest of the grown
    source falls back there again, so the new files are read by pandas, as it reads them."""
    spec = _spec("daily", "daily/*")
    days = tmp_path / "daily"
    dated = _frame(range(0, 300)).assign(day="2026-12-01")
    v1 = [_write(days, "a.csv", dated)]
    first = _ingest(spec, v1, tmp_path / "v1")
    assert first.reader.startswith("pandas (") and first.record["not_growable"].startswith("read by pandas (")
    v2 = v1 + [_write(days, "b.csv", _frame(range(1000, 1200)).assign(day="2026-12-02"))]
    grown = _ingest(spec, v2, tmp_path / "v2", _published(spec, first))
    assert grown.how.startswith("appended to the published version's 300 row(s): 200 new row(s) of the new file(s)")
    _assert_a_full_ingests(grown, _ingest(spec, v2, tmp_path / "whole"))


# -- on the platform: the pipeline's job on a store, twice -----------------------------------------

def _said(platform, result, needle: str) -> list[str]:
    return [e.message for e in platform.instance.all_logs(result.run_id) if needle in (e.message or "")]


def _object(platform, name: str, path: str) -> bytes:
    return platform.store().get_object("main", f"datasets/{name}/{path}")


def test_a_folder_of_parquet_files_grown_by_a_day_commits_only_the_new_parts(platform):
    spec = _spec("daily", "daily/*.parquet")
    days = platform.sources / "daily"
    for d in range(1, 5):
        _write(days, f"2026-12-0{d}.parquet", _frame(range(d * 1000, d * 1000 + 500)))
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    _write(days, "2026-12-05.parquet", _frame(range(5000, 5030)))
    second = platform.run(spec)
    assert second.success, failure_messages(second)
    assert _said(platform, second, "daily: appended to the published version's 2000 row(s): 30 new row(s) of the "
                                   "new file(s) 2026-12-05.parquet parsed and checked")

    # the same folder as a new dataset's first version: everything read, the same raw copy and shards
    shutil.copytree(days, platform.sources / "whole")
    built = platform.run(_spec("whole", "whole/*.parquet"))
    assert built.success, failure_messages(built)
    for path in ("raw/data.parquet", "raw/keys.parquet", "shards/manifest.json"):
        mine, theirs = _object(platform, "daily", path), _object(platform, "whole", path)
        if path.endswith(".json"):
            mine, theirs = (json.loads(m)["splits"] for m in (mine, theirs))
        assert mine == theirs, path

    # version 2's commit: the new parts' shard files in, the replaced part's out, and no other shard
    store = platform.store()
    tags = dataset_tags(store, "daily")
    prefix = "datasets/daily/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    new = {p["key"] for p in after["parts"]} - {p["key"] for p in before["parts"]}
    gone = {p["key"] for p in before["parts"]} - {p["key"] for p in after["parts"]}
    assert len(after["parts"]) >= 10 and 1 <= len(new) <= 3 and gone <= {before["parts"][-1]["key"]}

    def files(manifest: dict, keys: set[str]) -> set[str]:
        return {prefix + path for p in manifest["parts"] if p["key"] in keys for i in p["splits"].values()
                for path in i["shards"]}

    diff = {(d.path, d.type) for d in store.diff(tags[1], tags[2], prefix=prefix)}
    assert {path for path, _ in diff} == files(after, new) | files(before, gone) | {prefix + "manifest.json"}

    # a published day's file removed: every row read, and the log says which file and why
    (days / "2026-12-01.parquet").unlink()
    third = platform.run(spec)
    assert third.success, failure_messages(third)
    assert _said(platform, third, "daily: every row read (1530): 2026-12-01.parquet was published but is not in the "
                                  "source now (removed or renamed)")


# -- the raw copy's published row groups kept as bytes (assets/parquet_splice.py) ---------------------

def _raw_copy(spec, path: Path, chunks: list[range]) -> Path:
    """A raw copy of one row group per chunk of ids, as the full ingest writes it."""
    writer = ingest._ParquetAppender(path, spec)
    for ids in chunks:
        frame = _frame(ids)
        writer.append(frame[FEATURES].to_numpy(np.float32), frame["label"].astype(str).to_numpy(),
                      frame["id"].to_numpy())
    writer.close()
    return path


@pytest.mark.parametrize("keep, added", [(3, 2), (2, 2), (0, 1), (3, 0), (1, 0)])
def test_a_splice_of_kept_row_groups_and_new_ones_is_the_file_a_writer_of_all_of_them_writes(tmp_path, keep, added):
    from assets.parquet_splice import splice

    spec = _spec("daily", "daily/*")
    old = [range(0, 109), range(109, 218), range(218, 250)]
    new = [range(1000 + 109 * i, 1109 + 109 * i - 7 * i) for i in range(added)]
    published = _raw_copy(spec, tmp_path / "published.parquet", old)
    part = _raw_copy(spec, tmp_path / "added.parquet", new) if new else None
    splice(published, keep, part, tmp_path / "spliced.parquet")
    whole = _raw_copy(spec, tmp_path / "whole.parquet", old[:keep] + new)
    assert (tmp_path / "spliced.parquet").read_bytes() == whole.read_bytes()


def test_a_splice_refuses_files_a_writer_of_all_their_rows_would_not_have_written(tmp_path):
    from assets.parquet_splice import SpliceError, splice
    from pipelines.api import Source, dataset_pipeline

    spec = _spec("daily", "daily/*")
    published = _raw_copy(spec, tmp_path / "published.parquet", [range(0, 109), range(109, 150)])
    with pytest.raises(SpliceError, match="published.parquet has 2 row groups, not 3"):
        splice(published, 3, None, tmp_path / "out.parquet")
    other = dataset_pipeline("other", source=Source(paths=("x/*",)), features=FEATURES[::-1], label="label",
                             classes=range(3), id_column="id")  # the same columns, named in another order
    part = _raw_copy(other, tmp_path / "other.parquet", [range(200, 230)])
    with pytest.raises(SpliceError, match=r"the footers differ in FileMetaData field\(s\) \[5\]"):
        splice(published, 2, part, tmp_path / "out.parquet")
