"""A table in parts (issue 41, item 3): rows appended, changed or removed make new shards only in
the parts they fall in; the other parts' shards are the previous version's files, kept. The
features are stored as the source gives them and normalised on read with statistics merged from
the parts' moments (parallel mean and variance), so a version built on the previous one is the
version a build from nothing makes, bit for bit, and the trainer reads the features it read when
the shards held them normalised."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from assets.sharding import (
    CARRIED,
    Normalisation,
    assign_splits,
    build_shards,
    build_target_shards_from_chunks,
    merge_moments,
    moments,
)
from training_runtime.data.shard_format import NORMALISE_ON_READ, read_normalisation
from training_runtime.data.split import open_split

FEATURES = ("f0", "f1", "f2", "f3")


def _frame(ids: range, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame((rng.normal(size=(len(ids), 4)) * [1, 10, 100, 0.1] + [0, 5, -50, 2]).astype(np.float32),
                         columns=list(FEATURES))
    frame["label"] = [str(i % 3) for i in ids]
    frame["id"] = [f"row-{i:06d}" for i in ids]
    return frame


def _build(frame: pd.DataFrame, out: Path, previous: dict | None = None, salt: str = "s") -> dict:
    return build_shards(frame, out_dir=out, feature_columns=FEATURES, label_column="label", class_names=("0", "1", "2"),
                        id_column="id", feature_shape=(4,), seed=7, fractions=(0.8, 0.1, 0.1), samples_per_shard=64,
                        salt=salt, previous=previous)


def _written(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*.bin")}


def _published(manifest: dict) -> dict:
    """The manifest as a version publishes it: no carried marks."""
    return {**manifest, "splits": {s: {**i, "shards": [{k: v for k, v in e.items() if k != CARRIED}
                                                       for e in i["shards"]]} for s, i in manifest["splits"].items()}}


def _entries(manifest: dict) -> dict[str, str]:
    return {e["path"]: e["sha256"] for i in manifest["splits"].values() for e in i["shards"]}


def test_merged_moments_are_the_moments_of_all_the_rows():
    rng = np.random.default_rng(1)
    blocks = [rng.normal(loc=i, scale=1 + i, size=(n, 3)) for i, n in enumerate((5, 1, 40, 0, 17))]
    merged = merge_moments([moments(b) for b in blocks])
    whole = np.concatenate(blocks)
    assert merged["n"] == len(whole)
    np.testing.assert_allclose(merged["mean"], whole.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(merged["m2"]) / len(whole), whole.var(axis=0), rtol=1e-12)
    norm = Normalisation.from_moments(merged, 3)
    np.testing.assert_allclose(norm.std, whole.std(axis=0).astype(np.float32), rtol=1e-6)


def test_rows_appended_after_the_last_id_write_only_the_last_parts(tmp_path):
    first = _build(_frame(range(2000)), tmp_path / "v1")
    assert first[NORMALISE_ON_READ] and len(first["parts"]) >= 10
    grown = _frame(range(2020), seed=0)  # the same 2,000 rows (same draws) and 20 more ids after them
    pd.testing.assert_frame_equal(grown.iloc[:2000], _frame(range(2000)))

    second = _build(grown, tmp_path / "v2", previous=first)

    kept = [p for p in second["parts"] if p["key"] in {q["key"] for q in first["parts"]}]
    assert len(kept) >= len(first["parts"]) - 2  # the part the new ids join (and at most one cut after it)
    carried = {e["path"] for i in second["splits"].values() for e in i["shards"] if e.get(CARRIED)}
    assert carried == {path for p in kept for i in p["splits"].values() for path in i["shards"]}
    # only the new parts' shards were written; the kept ones are the first version's, byte for byte
    assert _written(tmp_path / "v2") == set(_entries(second)) - carried
    assert all(_entries(first)[path] == sha for path, sha in _entries(second).items() if path in carried)
    # a version built on the previous one is the version a build from nothing makes
    fresh = _build(grown, tmp_path / "fresh")
    assert json.dumps(_published(second), sort_keys=True) == json.dumps(fresh, sort_keys=True)
    assert sum(i["num_samples"] for i in second["splits"].values()) == 2020


def test_a_changed_and_a_removed_row_rewrite_only_their_parts(tmp_path):
    frame = _frame(range(2000))
    first = _build(frame, tmp_path / "v1")
    edited = frame.drop(index=1500).reset_index(drop=True)
    edited.loc[300, "f1"] += 1.0
    second = _build(edited, tmp_path / "v2", previous=first)
    made = [p for p in second["parts"] if p["key"] not in {q["key"] for q in first["parts"]}]
    holders = [p for p in first["parts"] if p["first_id"] <= "row-000300" <= p["last_id"]
               or p["first_id"] <= "row-001500" <= p["last_id"]]
    assert 2 <= len(made) <= len(holders) + 2 and len(made) < len(first["parts"]) // 3
    assert json.dumps(_published(second), sort_keys=True) == json.dumps(_build(edited, tmp_path / "fresh"),
                                                                        sort_keys=True)


def test_another_salt_keeps_no_part(tmp_path):
    frame = _frame(range(600))
    first = _build(frame, tmp_path / "v1")
    second = _build(frame, tmp_path / "v2", previous=first, salt="other preprocessing")
    assert _written(tmp_path / "v2") == set(_entries(second))  # every shard written again
    assert not any(e.get(CARRIED) for i in second["splits"].values() for e in i["shards"])


def test_splits_stay_and_the_normalisation_is_the_training_splits(tmp_path):
    frame = _frame(range(2000))
    grown = _frame(range(2300))
    first, second = _build(frame, tmp_path / "v1"), _build(grown, tmp_path / "v2", previous=None)
    for manifest, data in ((first, frame), (second, grown)):
        codes = assign_splits(data["id"], 7, (0.8, 0.1, 0.1))
        train = data.loc[codes == 0, list(FEATURES)].to_numpy(np.float64)
        norm = manifest["normalisation"]
        np.testing.assert_allclose(norm["mean"], train.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(norm["std"], train.std(axis=0), rtol=1e-5)
        assert manifest["splits"]["train"]["num_samples"] == int((codes == 0).sum())


def test_the_reader_normalises_as_the_shards_used_to_be(tmp_path):
    """Gathered through the runtime's reader, the features are ``(x - mean) / std`` in float32, the
    arithmetic the shards were written with when they held normalised features."""
    frame = _frame(range(700))
    out = tmp_path / "v1"
    manifest = _build(frame, out)
    (mean, std), = read_normalisation(manifest).values()
    split = open_split(manifest, [out / e["path"] for e in manifest["splits"]["train"]["shards"]], "train")
    got = split.gather(np.arange(split.num_samples), ["features", "label"])
    by_id = frame.set_index("id")
    train_ids = sorted(i for i, c in zip(frame["id"], assign_splits(frame["id"], 7, (0.8, 0.1, 0.1))) if c == 0)
    order = [i for p in manifest["parts"] for i in train_ids if p["first_id"] <= i <= p["last_id"]]
    expected = by_id.loc[order, list(FEATURES)].to_numpy(np.float32).copy()
    expected -= mean
    expected /= std
    np.testing.assert_array_equal(got["features"], expected)
    np.testing.assert_array_equal(got["label"], by_id.loc[order, "label"].astype(int).to_numpy())


def test_regression_targets_keep_their_units_and_merge_their_statistics(tmp_path):
    frame = _frame(range(1500))
    target = (frame["f0"] * 3 + 1).to_numpy(np.float32)
    chunk = (frame[list(FEATURES)].to_numpy(np.float32), target, frame["id"].to_numpy())
    args = dict(task="regression", feature_columns=FEATURES, target_names=("y",), id_column="id", feature_shape=(4,),
                seed=7, fractions=(0.8, 0.1, 0.1), samples_per_shard=64, salt="s")
    first = build_target_shards_from_chunks([chunk], out_dir=tmp_path / "v1", **args)
    codes = assign_splits(frame["id"], 7, (0.8, 0.1, 0.1))
    train = target[codes == 0].astype(np.float64)
    assert first["target_normalisation"]["mean"] == pytest.approx(train.mean(), rel=1e-9)
    assert first["target_normalisation"]["std"] == pytest.approx(train.std(), rel=1e-9)
    grown = _frame(range(1530))
    gtarget = (grown["f0"] * 3 + 1).to_numpy(np.float32)
    second = build_target_shards_from_chunks(
        [(grown[list(FEATURES)].to_numpy(np.float32), gtarget, grown["id"].to_numpy())], out_dir=tmp_path / "v2",
        previous=first, **args)
    carried = {e["path"] for i in second["splits"].values() for e in i["shards"] if e.get(CARRIED)}
    assert carried and _written(tmp_path / "v2") == set(_entries(second)) - carried


LEDGER = {"frame": _frame(range(3000))}


@pytest.mark.slow
def test_a_version_with_appended_rows_commits_only_the_new_parts_shards(platform):
    """Through the dataset's job on a local platform: the second version's commit adds and removes
    the shard files of the parts the new rows fall in, and no other; the trainer's reader gets the
    grown table's rows normalised with the grown training split's statistics."""
    from core.datasets import dataset_tags
    from pipelines.api import dataset_pipeline
    from tests.pipeline.conftest import failure_messages

    spec = dataset_pipeline("ledger", source=lambda: LEDGER["frame"], features=list(FEATURES), label="label",
                            classes=range(3), id_column="id", split={"seed": 7, "samples_per_shard": 64})
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    LEDGER["frame"] = _frame(range(3030))  # 1 % more rows, their ids after the others
    second = platform.run(spec)
    assert second.success, failure_messages(second)

    store = platform.store()
    tags = dataset_tags(store, "ledger")
    assert sorted(tags) == [1, 2]
    prefix = "datasets/ledger/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    new = {p["key"] for p in after["parts"]} - {p["key"] for p in before["parts"]}
    gone = {p["key"] for p in before["parts"]} - {p["key"] for p in after["parts"]}
    # Only the last part can change (it ends at the data's end, unless a cut fell there): the new rows
    # extend it, and the cut rule (at least a quarter of samples_per_shard rows between cuts) allows
    # at most two more cuts in 30 rows.
    assert gone <= {before["parts"][-1]["key"]}, "an append after the last id rewrote parts before the last"
    assert 1 <= len(new) <= 3 and len(after["parts"]) >= 30
    # exactly: v2 is v1's parts but the last, in order, then the new ones, the first of which starts
    # where the replaced part started (the appended rows continue it)
    after_keys = [p["key"] for p in after["parts"]]
    kept = [p["key"] for p in before["parts"]][:len(before["parts"]) - len(gone)]
    assert after_keys[:len(kept)] == kept and set(after_keys[len(kept):]) == new
    if gone:
        assert after["parts"][len(kept)]["first_id"] == before["parts"][-1]["first_id"]

    def files(manifest: dict, keys: set[str]) -> set[str]:
        return {prefix + path for p in manifest["parts"] if p["key"] in keys for i in p["splits"].values()
                for path in i["shards"]}

    diff = {(d.path, d.type) for d in store.diff(tags[1], tags[2], prefix=prefix)}
    assert {path for path, _ in diff} == files(after, new) | files(before, gone) | {prefix + "manifest.json"}
    assert {path for path, kind in diff if kind == "added"} == files(after, new) - files(before, gone)
    logs = [e.message for e in platform.instance.all_logs(second.run_id) if "part(s) sharded" in (e.message or "")]
    assert logs and f"{len(new)} of {len(after['parts'])} part(s) sharded" in logs[0]
    # the checks read back the new parts' files alone; the kept ones count by their parts' summaries
    checked = [e.message for e in platform.instance.all_logs(second.run_id) if "shard checks on" in (e.message or "")]
    all_files = sum(len(i["shards"]) for i in after["splits"].values())
    assert checked == [f"ledger: shard checks on {len(files(after, new))} shard file(s) read back and "
                       f"{all_files - len(files(after, new))} kept one(s) counted by their parts' summaries"]

    # read back as the trainer reads it: every row once, normalised with the grown split's figures
    from training_runtime.data.split import open_split

    tmp = platform.root / "read"
    paths = [store.download(tags[2], prefix + e["path"], tmp / e["path"]) for e in after["splits"]["train"]["shards"]]
    split = open_split(after, paths, "train")
    got = split.gather(np.arange(split.num_samples), ["features"])["features"]
    np.testing.assert_allclose(got.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=0), 1, rtol=1e-4)
    assert split.num_samples == int((assign_splits(LEDGER["frame"]["id"], 7, (0.8, 0.1, 0.1)) == 0).sum())


# ---------------------------------------------------------------- the shard checks of a version in parts
class _Folder:
    """The store's two reads the shard checks use, over a local folder; it counts what is read."""

    def __init__(self, root: Path):
        self.root, self.read = root, []

    def get_object(self, ref: str, path: str) -> bytes:
        self.read.append(path)
        return (self.root / path).read_bytes()

    def download(self, ref: str, path: str, dest: Path) -> Path:
        import shutil

        self.read.append(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copyfile(self.root / path, dest))


def _version_folder(tmp_path: Path, name: str, *manifests_dirs: Path) -> Path:
    """One folder holding every version's shard files, as a branch holds the kept and new ones."""
    import shutil

    folder = tmp_path / name
    for d in manifests_dirs:
        shutil.copytree(d, folder, dirs_exist_ok=True)
    return folder


def _suite(spec_classes=3, max_abs: float = 1e3):
    from core.expectations import standard_shard_expectations
    from pipelines.api import dataset_pipeline

    spec = dataset_pipeline("parts", source=lambda: None, features=list(FEATURES), label="label",
                            classes=range(spec_classes), id_column="id")
    return standard_shard_expectations(spec, max_abs_feature=max_abs)


def _check(store, manifest: dict, suite) -> tuple:
    from assets import quality

    read = quality.shard_tables(store, "branch", "", manifest, suite)
    report = quality.run_suite("parts/shards", suite, read.tables)
    for failure in read.failures:
        report = report.with_failure(failure)
    return read, report


def test_the_checks_read_back_only_the_new_parts_shards_and_judge_the_version_whole(tmp_path):
    first = _build(_frame(range(2000)), tmp_path / "v1")
    second = _build(_frame(range(2020)), tmp_path / "v2", previous=first)
    folder = _version_folder(tmp_path, "branch", tmp_path / "v1", tmp_path / "v2")
    suite = _suite()

    store = _Folder(folder)
    read, report = _check(store, second, suite)
    new = set(_entries(second)) - {e["path"] for i in second["splits"].values() for e in i["shards"] if e.get(CARRIED)}
    assert set(store.read) == new and read.read == len(new) and read.summarised == len(_entries(second)) - len(new)
    assert read.why_read_kept is None and report.passed, report.failures

    # the same figures a read of every shard gives: which splits and labels, the largest value
    whole_store = _Folder(folder)
    whole, whole_report = _check(whole_store, _published(second), suite)
    assert set(whole_store.read) == set(_entries(second)) and whole_report.passed
    got, every = read.tables["samples"], whole.tables["samples"]
    assert got["max_abs"].max() == every["max_abs"].max()
    for column in ("split", "label", "train_label", "finite"):
        assert set(got[column].dropna()) == set(every[column].dropna())
    pd.testing.assert_frame_equal(read.tables["splits"], whole.tables["splits"])


def test_a_kept_part_is_judged_under_the_new_versions_normalisation(tmp_path):
    """Rows appended at one value shrink the training split's spread: the kept parts' rows, read
    as the trainer reads them, then lie further from the mean, and a bound they met in the first
    version fails in the second, judged from their extremes without reading them."""
    frame = _frame(range(2000))
    first = _build(frame, tmp_path / "v1")
    grown = pd.concat([frame, _frame(range(2000, 4000))], ignore_index=True)
    grown.loc[2000:, list(FEATURES)] = frame[list(FEATURES)].mean().to_numpy()
    second = _build(grown, tmp_path / "v2", previous=first)
    folder = _version_folder(tmp_path, "branch", tmp_path / "v1", tmp_path / "v2")
    whole, _ = _check(_Folder(folder), _published(first), _suite())
    bound = float(whole.tables["samples"]["max_abs"].max()) * 1.2  # the first version's largest, and some

    _, first_report = _check(_Folder(folder), first, _suite(max_abs=bound))
    assert first_report.passed, first_report.failures
    store = _Folder(folder)
    read, report = _check(store, second, _suite(max_abs=bound))
    assert read.summarised > 0 and not report.passed
    assert any("max_abs" in f for f in report.failures), report.failures
    made = sum(e["num_samples"] for i in second["splits"].values() for e in i["shards"] if not e.get(CARRIED))
    summary_rows = read.tables["samples"].iloc[made:]  # after the rows read back
    assert len(summary_rows) and summary_rows["max_abs"].max() > bound
    whole, _ = _check(_Folder(folder), _published(second), _suite())
    assert read.tables["samples"]["max_abs"].max() == whole.tables["samples"]["max_abs"].max()


def test_a_bad_new_shard_fails_the_gate_naming_it(tmp_path):
    first = _build(_frame(range(2000)), tmp_path / "v1")
    second = _build(_frame(range(2020)), tmp_path / "v2", previous=first)
    folder = _version_folder(tmp_path, "branch", tmp_path / "v1", tmp_path / "v2")
    bad = next(e["path"] for e in second["splits"]["train"]["shards"] if not e.get(CARRIED))
    data = bytearray((folder / bad).read_bytes())
    data[0] ^= 0xFF
    (folder / bad).write_bytes(bytes(data))
    read, report = _check(_Folder(folder), second, _suite())
    assert not report.passed
    assert any(f.startswith(f"shard {bad}: sha256") for f in report.failures), report.failures


def test_a_new_part_with_a_non_finite_feature_fails_the_version(tmp_path):
    first = _build(_frame(range(2000)), tmp_path / "v1")
    grown = _frame(range(2020))
    grown.loc[2010, "f2"] = np.inf
    second = _build(grown, tmp_path / "v2", previous=first)
    folder = _version_folder(tmp_path, "branch", tmp_path / "v1", tmp_path / "v2")
    read, report = _check(_Folder(folder), second, _suite())
    assert read.summarised > 0 and not report.passed
    assert any("finite" in f for f in report.failures), report.failures


def test_a_suite_that_needs_every_row_reads_the_kept_shards_back(tmp_path):
    import great_expectations as gx

    first = _build(_frame(range(2000)), tmp_path / "v1")
    second = _build(_frame(range(2020)), tmp_path / "v2", previous=first)
    folder = _version_folder(tmp_path, "branch", tmp_path / "v1", tmp_path / "v2")
    suite = _suite()
    suite["samples"] = [*suite["samples"], gx.expectations.ExpectColumnMeanToBeBetween(column="max_abs", max_value=5)]
    store = _Folder(folder)
    read, report = _check(store, second, suite)
    assert set(store.read) == set(_entries(second)) and read.summarised == 0
    assert "expect_column_mean_to_be_between(max_abs)" in read.why_read_kept and report.passed, report.failures


@pytest.mark.parametrize("task", ["regression", "multilabel"])
def test_v2_tables_judge_kept_parts_by_their_summaries(tmp_path, task):
    from assets import quality
    from core.expectations import standard_shard_expectations
    from pipelines.api import dataset_pipeline

    def chunk(n: int):
        frame = _frame(range(n))
        x = frame[list(FEATURES)].to_numpy(np.float32)
        if task == "regression":
            y = (frame["f0"] * 3 + 1).to_numpy(np.float32)
        else:
            y = np.stack([(frame["f0"] > 0), (frame["f1"] > 5)], axis=1).astype(np.float32)
        return [(x, y, frame["id"].to_numpy())]

    names = ("y",) if task == "regression" else ("a", "b")
    args = dict(task=task, feature_columns=FEATURES, target_names=names, id_column="id", feature_shape=(4,),
                seed=7, fractions=(0.8, 0.1, 0.1), samples_per_shard=64, salt="s")
    first = build_target_shards_from_chunks(chunk(2000), out_dir=tmp_path / "v1", **args)
    second = build_target_shards_from_chunks(chunk(2020), out_dir=tmp_path / "v2", previous=first, **args)
    folder = _version_folder(tmp_path, "branch", tmp_path / "v1", tmp_path / "v2")
    if task == "regression":
        spec = dataset_pipeline("parts", source=lambda: None, features=list(FEATURES), label="y", task="regression",
                                id_column="id", target_range=(-100, 100))
    else:
        spec = dataset_pipeline("parts", source=lambda: None, features=list(FEATURES), labels=list(names),
                                task="multilabel", id_column="id")
    suite = standard_shard_expectations(spec)
    store = _Folder(folder)
    read, report = _check(store, second, suite)
    assert read.summarised > 0 and read.read == len(store.read) < len(_entries(second))
    assert report.passed, report.failures
    whole, _ = _check(_Folder(folder), _published(second), suite)
    got, every = read.tables["samples"], whole.tables["samples"]
    assert got["max_abs"].max() == every["max_abs"].max()
    if task == "regression":
        assert (got["target"].min(), got["target"].max()) == (every["target"].min(), every["target"].max())
    else:
        pd.testing.assert_frame_equal(read.tables["labels"], whole.tables["labels"])
        assert quality.untrained_labels(read.tables) is None
