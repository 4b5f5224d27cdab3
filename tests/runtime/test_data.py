import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from training_runtime.data.shards import DataError, resolve_shards
from training_runtime.data.loader import TypedLoader, open_split
from training_runtime.data.sampling import epoch_indices, steps_per_epoch
from tests.runtime.helpers import make_dataset


@pytest.mark.parametrize("n, world", [(10, 1), (10, 3), (7, 4), (3, 5), (512, 8)])
def test_partition_matches_distributed_sampler_without_shuffle(n, world):
    for rank in range(world):
        ref = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        assert epoch_indices(n, world, rank, epoch=0, seed=0, shuffle=False).tolist() == ref


@pytest.mark.parametrize("n, world", [(10, 1), (10, 3), (7, 4), (3, 5), (1437, 8)])
def test_every_sample_once_per_epoch_and_equal_counts(n, world):
    parts = [epoch_indices(n, world, r, epoch=2, seed=7) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    allidx = np.concatenate(parts)
    assert set(allidx.tolist()) == set(range(n))
    assert len(allidx) - n == (-n) % world  # only the DistributedSampler padding repeats


def test_shuffle_is_epoch_seeded():
    a = epoch_indices(100, 2, 0, epoch=0, seed=1)
    assert np.array_equal(a, epoch_indices(100, 2, 0, epoch=0, seed=1))
    assert not np.array_equal(a, epoch_indices(100, 2, 0, epoch=1, seed=1))
    assert not np.array_equal(a, epoch_indices(100, 2, 0, epoch=0, seed=2))


def test_global_batches_do_not_depend_on_world_size():
    """Step k consumes positions [k*B, (k+1)*B) of the epoch permutation for any world size."""
    n, batch = 96, 16
    order = epoch_indices(n, 1, 0, epoch=3, seed=5)
    for world in (2, 4):
        per = [epoch_indices(n, world, r, epoch=3, seed=5) for r in range(world)]
        b = batch // world
        for k in range(n // batch):
            got = sorted(np.concatenate([p[k * b:(k + 1) * b] for p in per]).tolist())
            assert got == sorted(order[k * batch:(k + 1) * batch].tolist())


@pytest.mark.parametrize("n, world, batch, expected", [(192, 2, 16, 12), (193, 2, 16, 13),
                                                       (10, 4, 4, 3), (1437, 8, 64, 23)])
def test_steps_per_epoch(n, world, batch, expected):
    """ceil(N / B) for any world size: the global order's padding to a multiple of the world
    size never adds a step, since the world size divides B."""
    assert steps_per_epoch(n, batch) == expected
    per_rank = -(-n // world)
    assert -(-per_rank // (batch // world)) == expected  # the global order's steps, rank by rank


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    manifest, locations = make_dataset(root, n_train=70, n_test=10, feature_shape=(2, 3),
                                       per_shard=16)
    return root, manifest, locations


def _reference(root, manifest, split="train"):
    xs, ys = [], []
    for s in manifest["splits"][split]["shards"]:
        raw = (root / s["path"]).read_bytes()
        n = s["num_samples"]
        xs.append(np.frombuffer(raw[:n * 24], "<f4").reshape(n, 2, 3))
        ys.append(np.frombuffer(raw[n * 24:], "<i8"))
    return np.concatenate(xs), np.concatenate(ys)


def _features_and_labels(gathered: dict) -> tuple[np.ndarray, np.ndarray]:
    return gathered["features"], gathered["label"]


def test_gather_reads_the_right_samples_across_shards(dataset):
    root, manifest, locations = dataset
    data = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    x_ref, y_ref = _reference(root, manifest)
    idx = np.array([69, 0, 15, 16, 33, 33, 47, 1])
    x, y = _features_and_labels(data.gather(idx))
    assert x.flags.c_contiguous and x.dtype == np.float32 and x.shape == (8, 2, 3)
    np.testing.assert_array_equal(x, x_ref[idx])
    np.testing.assert_array_equal(y, y_ref[idx])


def test_prefetch_loader_yields_batches_in_order_from_start_step(dataset):
    root, manifest, locations = dataset
    data = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    x_ref, y_ref = _reference(root, manifest)
    idx = epoch_indices(70, 2, 1, epoch=0, seed=3)
    for workers in (1, 3):
        loader = TypedLoader(data, idx, 8, 2, torch.device("cpu"), epoch=0, seed=3,
                             num_workers=workers, prefetch_batches=2)
        batches = list(loader)
        assert len(batches) == len(loader) == 3  # 35 samples in batches of 8: 5 batches, from 2
        expect = [np.sort(idx[i:i + 8]) for i in range(16, 35, 8)]  # index order within a batch
        for b, e in zip(batches, expect, strict=True):
            np.testing.assert_array_equal(b["features"].numpy(), x_ref[e])
            np.testing.assert_array_equal(b["label"].numpy(), y_ref[e])
        assert loader.wait_s >= 0


def test_prefetch_loader_reports_worker_errors(dataset):
    root, manifest, locations = dataset
    data = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    bad = np.array([0, 1, 10_000])
    with pytest.raises(DataError, match="loading batch 0 failed"):
        list(TypedLoader(data, bad, 3, 0, torch.device("cpu"), epoch=0, seed=0))


def test_missing_shard_and_checksum_mismatch(dataset, tmp_path):
    root, manifest, locations = dataset
    locs = dict(locations)
    locs["shards/train/00002.bin"] = (tmp_path / "gone.bin").as_uri()
    with pytest.raises(DataError, match=r"shard 'shards/train/00002.bin' is missing"):
        resolve_shards(manifest, locs, "train", None)
    raw = bytearray((root / "shards/train/00001.bin").read_bytes())
    raw[5] ^= 0xFF
    (tmp_path / "bad.bin").write_bytes(bytes(raw))
    locs = dict(locations)
    locs["shards/train/00001.bin"] = (tmp_path / "bad.bin").as_uri()
    with pytest.raises(DataError, match=r"checksum mismatch for shard 'shards/train/00001.bin'"):
        resolve_shards(manifest, locs, "train", None)
    with pytest.raises(DataError, match="has no split 'holdout'"):
        resolve_shards(manifest, locations, "holdout", None)


def test_labels_outside_num_classes_are_rejected(dataset):
    root, manifest, locations = dataset
    small = dict(manifest, num_classes=2)
    paths = resolve_shards(manifest, locations, "train", None)
    with pytest.raises(DataError, match=r"outside \[0, num_classes=2\)"):
        open_split(small, paths, "train")


def test_gather_keeps_the_requested_order_for_unsorted_indices(dataset):
    root, manifest, locations = dataset
    data = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    x_ref, y_ref = _reference(root, manifest)
    for idx in (np.arange(70), np.array([5, 3, 60, 3, 17, 0]), np.array([], dtype=np.int64)):
        x, y = _features_and_labels(data.gather(idx))
        np.testing.assert_array_equal(x, x_ref[idx])
        np.testing.assert_array_equal(y, y_ref[idx])
    with pytest.raises(IndexError, match="out of range"):
        data.gather(np.array([70]))


def test_gather_of_large_samples_takes_the_indexed_copy_path(tmp_path):
    """Samples of 64 KiB and more are copied with an advanced index instead of np.take."""
    shape = (128, 128)  # 64 KiB of float32 per sample
    manifest, locations = make_dataset(tmp_path, n_train=24, n_test=4, feature_shape=shape, per_shard=7)
    data = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    xs, ys = [], []
    for s in manifest["splits"]["train"]["shards"]:
        raw = (tmp_path / s["path"]).read_bytes()
        n, width = s["num_samples"], 128 * 128 * 4
        xs.append(np.frombuffer(raw[:n * width], "<f4").reshape(n, *shape))
        ys.append(np.frombuffer(raw[n * width:], "<i8"))
    x_ref, y_ref = np.concatenate(xs), np.concatenate(ys)
    idx = np.array([23, 0, 6, 7, 7, 14, 1])
    x, y = _features_and_labels(data.gather(idx))
    np.testing.assert_array_equal(x, x_ref[idx])
    np.testing.assert_array_equal(y, y_ref[idx])


def test_chained_epochs_yield_nothing_for_a_finished_run():
    from training_runtime.data.prefetch import chained_epochs

    made = []
    assert list(chained_epochs(lambda e, first: made.append(e), 27, 9, 27)) == []
    assert made == []  # no loader is even built
