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

    def files(manifest: dict, keys: set[str]) -> set[str]:
        return {prefix + path for p in manifest["parts"] if p["key"] in keys for i in p["splits"].values()
                for path in i["shards"]}

    diff = {(d.path, d.type) for d in store.diff(tags[1], tags[2], prefix=prefix)}
    assert {path for path, _ in diff} == files(after, new) | files(before, gone) | {prefix + "manifest.json"}
    assert {path for path, kind in diff if kind == "added"} == files(after, new) - files(before, gone)
    logs = [e.message for e in platform.instance.all_logs(second.run_id) if "part(s) sharded" in (e.message or "")]
    assert logs and f"{len(new)} of {len(after['parts'])} part(s) sharded" in logs[0]

    # read back as the trainer reads it: every row once, normalised with the grown split's figures
    from training_runtime.data.split import open_split

    tmp = platform.root / "read"
    paths = [store.download(tags[2], prefix + e["path"], tmp / e["path"]) for e in after["splits"]["train"]["shards"]]
    split = open_split(after, paths, "train")
    got = split.gather(np.arange(split.num_samples), ["features"])["features"]
    np.testing.assert_allclose(got.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=0), 1, rtol=1e-4)
    assert split.num_samples == int((assign_splits(LEDGER["frame"]["id"], 7, (0.8, 0.1, 0.1)) == 0).sum())
