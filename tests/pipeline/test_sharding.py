"""Pure logic of the shards asset: split stability, normalisation, shard layout, manifest."""

import hashlib

import numpy as np
import pandas as pd
import pytest

from assets.sharding import MANIFEST_FORMAT, Normalisation, assign_splits, build_shards, decode_shard, encode_shard


def _frame(n: int, width: int = 4, classes: int = 3, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.normal(size=(n, width)).astype(np.float32), columns=[f"f{i}" for i in range(width)])
    frame["label"] = [str(i % classes) for i in range(n)]
    frame["id"] = [f"row-{i}" for i in range(n)]
    return frame


def _build(frame, tmp_path, **kw):
    args = dict(out_dir=tmp_path, feature_columns=("f0", "f1", "f2", "f3"), label_column="label",
                class_names=("0", "1", "2"), id_column="id", feature_shape=(4,), seed=7,
                fractions=(0.8, 0.1, 0.1), samples_per_shard=64)
    args.update(kw)
    return build_shards(frame, **args)


def test_split_fractions_are_close_to_requested():
    ids = pd.Series([f"id-{i}" for i in range(20_000)])
    split = assign_splits(ids, seed=1, fractions=(0.8, 0.1, 0.1))
    shares = np.bincount(split, minlength=3) / len(split)
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.01)


def test_split_is_stable_when_data_grows_and_depends_on_seed():
    ids = pd.Series([f"id-{i}" for i in range(1000)])
    grown = pd.Series([f"id-{i}" for i in range(1500)])
    a = assign_splits(ids, 3, (0.8, 0.1, 0.1))
    b = assign_splits(grown, 3, (0.8, 0.1, 0.1))
    np.testing.assert_array_equal(a, b[:1000])
    assert (assign_splits(ids, 4, (0.8, 0.1, 0.1)) != a).any()


def test_shard_round_trip_and_layout():
    f = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([2, 0, 1], dtype=np.int64)
    data = encode_shard(f, y)
    assert len(data) == 3 * 4 * 4 + 3 * 8
    f2, y2 = decode_shard(data, 3, (4,))
    np.testing.assert_array_equal(f, f2)
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(ValueError, match="expected"):
        decode_shard(data[:-1], 3, (4,))


def test_normalisation_uses_train_statistics_and_keeps_constant_features():
    x = np.array([[1.0, 5.0], [3.0, 5.0]], dtype=np.float32)
    norm = Normalisation.fit(x)
    out = norm.apply(x)
    np.testing.assert_allclose(out[:, 0], [-1.0, 1.0])
    np.testing.assert_allclose(out[:, 1], [0.0, 0.0])


def test_build_shards_manifest_matches_files(tmp_path):
    manifest = _build(_frame(500), tmp_path)
    assert manifest["format"] == MANIFEST_FORMAT
    total = 0
    for split, info in manifest["splits"].items():
        assert info["num_samples"] == sum(e["num_samples"] for e in info["shards"])
        for e in info["shards"]:
            data = (tmp_path / e["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == e["sha256"]
            assert len(data) == e["num_bytes"]
            assert e["num_samples"] <= 64
        total += info["num_samples"]
    assert total == 500


def test_build_shards_is_deterministic_regardless_of_row_order(tmp_path):
    frame = _frame(300)
    m1 = _build(frame, tmp_path / "a")
    m2 = _build(frame.sample(frac=1.0, random_state=3), tmp_path / "b")
    assert m1 == m2


def test_labels_are_class_indices(tmp_path):
    manifest = _build(_frame(200), tmp_path)
    labels = np.concatenate([
        decode_shard((tmp_path / e["path"]).read_bytes(), e["num_samples"], (4,))[1]
        for info in manifest["splits"].values() for e in info["shards"]])
    assert set(labels.tolist()) == {0, 1, 2}


def test_too_little_data_for_a_split_is_refused(tmp_path):
    with pytest.raises(ValueError, match="split is empty"):
        _build(_frame(2), tmp_path)
