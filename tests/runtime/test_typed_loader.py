"""Shard format v2 in the runtime: TypedSplit's gather, decoding on threads, seeded augmentation,
the per-rank loader, corrupt shards, and open_split for both formats."""

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from training_runtime.data import shards as data_mod
from training_runtime.data.shards import DataError, resolve_shards
from training_runtime.data.sampling import epoch_indices
from training_runtime.data.shard_format import FORMAT_V2, Column, ShardWriter
from training_runtime.data.augment import ImageAugment, sample_random_words
from training_runtime.data.decode import ImageDecoder
from training_runtime.data.loader import TypedLoader, TypedSplit, open_split
from tests.runtime.helpers import make_dataset

CPU = torch.device("cpu")
SHARD_SIZES = (7, 7, 6)  # 20 samples, batches cross shard boundaries
N = sum(SHARD_SIZES)
IMAGE = (12, 10, 3)
JPEG = (16, 16, 3)
COLUMNS = [Column("image", "ndarray", "input", "uint8", IMAGE), Column("jpeg", "bytes", "input"),
           Column("label", "ndarray", "target", "int64"), Column("tokens", "ndarray", "input", "int32", (9,)),
           Column("id", "str", "id")]


def _encode(image: np.ndarray, i: int) -> bytes:
    """Mostly JPEG (simplejpeg); every 5th sample PNG and every 7th WebP, which Pillow decodes."""
    if i % 5 == 4 or i % 7 == 6:
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="PNG" if i % 5 == 4 else "WEBP", lossless=True)
        return buf.getvalue()
    return simplejpeg.encode_jpeg(image, quality=90)


def write_v2(root: Path, columns: list[Column], samples: dict, sizes=SHARD_SIZES, num_classes=None):
    """Shards of ``samples`` (column -> all values) under root; returns manifest, locations, paths."""
    writer, entries, start = ShardWriter(columns), [], 0
    for s, n in enumerate(sizes):
        part = {k: v[start:start + n] for k, v in samples.items()}
        entries.append(writer.write(root / f"train/{s:05d}.bin", f"train/{s:05d}.bin", part))
        start += n
    manifest = {"format": FORMAT_V2, "columns": [c.to_dict() for c in columns],
                "splits": {"train": {"num_samples": start, "shards": entries}}}
    if num_classes is not None:
        manifest["num_classes"] = num_classes
    locations = {e["path"]: (root / e["path"]).as_uri() for e in entries}
    return manifest, locations, [root / e["path"] for e in entries]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("v2")
    rng = np.random.default_rng(0)
    pictures = rng.integers(0, 256, (N, *JPEG), dtype=np.uint8)
    samples = {"image": rng.integers(0, 256, (N, *IMAGE), dtype=np.uint8),
               "jpeg": [_encode(p, i) for i, p in enumerate(pictures)],
               "label": rng.integers(0, 4, N), "tokens": rng.integers(0, 50_000, (N, 9)).astype(np.int32),
               "id": [f"sample-{i:03d}" for i in range(N)]}
    manifest, locations, paths = write_v2(root, COLUMNS, samples, num_classes=4)
    decoded = np.stack([simplejpeg.decode_jpeg(b) if b[:2] == b"\xff\xd8" else pictures[i]
                        for i, b in enumerate(samples["jpeg"])])
    return {"root": root, "manifest": manifest, "locations": locations, "paths": paths, "samples": samples,
            "decoded": decoded}


@pytest.fixture(scope="module")
def split(written):
    return TypedSplit(written["manifest"], written["paths"], "train")


def _ids(batch) -> list[int]:
    return [int(s.split("-")[1]) for s in batch["id"]]


def _epoch(split, *, epoch=0, seed=3, world=1, batch=4, start=0, **kw) -> list[dict]:
    """Every batch of every rank for one epoch (ranks one after the other)."""
    out = []
    for rank in range(world):
        idx = epoch_indices(split.num_samples, world, rank, epoch, seed)
        out += list(TypedLoader(split, idx, batch, start, CPU, epoch=epoch, seed=seed, **kw))
    return out


def _by_sample(batches, column) -> dict[int, np.ndarray]:
    return {i: b[column][k].numpy() for b in batches for k, i in enumerate(_ids(b))}


# ---------------------------------------------------------------- gather
@pytest.mark.parametrize("idx", [np.arange(N), np.array([19, 0, 6, 7, 7, 13, 14, 1]), np.array([5]),
                                 np.array([], dtype=np.int64), np.arange(N)[::-1]])
def test_gather_returns_the_written_samples_in_the_order_asked(written, split, idx):
    got = split.gather(idx)
    s = written["samples"]
    for name in ("image", "label", "tokens"):
        assert got[name].flags.c_contiguous and got[name].dtype == s[name].dtype
        np.testing.assert_array_equal(got[name], s[name][idx])
    assert got["jpeg"] == [s["jpeg"][i] for i in idx]
    assert got["id"] == [s["id"][i].encode() for i in idx]


def test_gather_of_large_samples_and_into_given_arrays(tmp_path):
    """128x128x4 uint8 (64 KiB) samples take the advanced-index copy; ``out`` is filled in place."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (9, 128, 128, 4), dtype=np.uint8)
    cols = [Column("image", "ndarray", "input", "uint8", (128, 128, 4))]
    manifest, _, paths = write_v2(tmp_path, cols, {"image": images}, sizes=(4, 5))
    big = TypedSplit(manifest, paths, "train")
    idx = np.array([8, 0, 3, 4, 4])
    out = np.empty((5, 128, 128, 4), np.uint8)
    assert big.gather(idx, out={"image": out})["image"] is out
    np.testing.assert_array_equal(out, images[idx])
    with pytest.raises(ValueError, match="the batch needs a contiguous uint8"):
        big.gather(idx, out={"image": np.empty((5, 128, 128, 3), np.uint8)})
    with pytest.raises(IndexError, match="out of range"):
        big.gather(np.array([9]))


def test_resolve_shards_verifies_and_caches_v2_shards_like_v1(written, tmp_path, monkeypatch):
    man, locs = written["manifest"], written["locations"]
    assert resolve_shards(man, locs, "train", None) == written["paths"]
    # s3:// shards enter the cache as <sha256>.bin once their size and checksum match
    fetched = []

    def fake_fetch(url, dest, endpoint_url):
        fetched.append(url)
        shutil.copy(written["root"] / url.removeprefix("s3://bucket/"), dest)

    monkeypatch.setattr(data_mod, "_fetch_s3", fake_fetch)
    s3 = {p: f"s3://bucket/{p}" for p in locs}
    cached = resolve_shards(man, s3, "train", str(tmp_path / "cache"))
    assert [p.name for p in cached] == [f"{e['sha256']}.bin" for e in man["splits"]["train"]["shards"]]
    assert resolve_shards(man, s3, "train", str(tmp_path / "cache")) == cached and len(fetched) == 3
    raw = bytearray(cached[1].read_bytes())
    raw[100] ^= 0xFF
    cached[1].write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"checksum mismatch for shard 'train/00001.bin'"):
        resolve_shards(man, s3, "train", str(tmp_path / "cache"))
    assert not cached[1].exists()  # fetched again next time


# ---------------------------------------------------------------- corrupt shards
def test_a_shard_of_the_wrong_size_is_refused_naming_it(written, tmp_path):
    paths = [tmp_path / f"{i}.bin" for i in range(3)]
    for src, dst in zip(written["paths"], paths):
        shutil.copy(src, dst)
    with open(paths[2], "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(DataError, match=r"shard 'train/00002.bin' .* holds \d+ bytes, the manifest says"):
        TypedSplit(written["manifest"], paths, "train")


@pytest.mark.parametrize("corrupt", ["decreasing", "past_the_end"])
def test_bad_offsets_are_refused_naming_the_shard_and_column(written, tmp_path, corrupt):
    shutil.copytree(written["root"] / "train", tmp_path / "train")
    entry = written["manifest"]["splits"]["train"]["shards"][1]
    path = tmp_path / entry["path"]
    raw = bytearray(path.read_bytes())
    start = entry["columns"]["jpeg"]["offset"]
    offsets = np.frombuffer(raw, "<u8", count=entry["num_samples"] + 1, offset=start).copy()
    if corrupt == "decreasing":
        offsets[2], offsets[3] = offsets[3], offsets[2]
    else:
        offsets[-1] += 1
    raw[start:start + offsets.nbytes] = offsets.tobytes()
    path.write_bytes(bytes(raw))
    paths = [tmp_path / e["path"] for e in written["manifest"]["splits"]["train"]["shards"]]
    with pytest.raises(DataError, match=r"shard 'train/00001.bin' .*column 'jpeg': the offset index does not match"):
        TypedSplit(written["manifest"], paths, "train")


def test_targets_outside_num_classes_are_refused(written):
    refused = r"shard 'train/0000\d.bin' column 'label' holds 3 outside \[0, num_classes=3\)"
    with pytest.raises(DataError, match=refused):
        TypedSplit(dict(written["manifest"], num_classes=3), written["paths"], "train")


# ---------------------------------------------------------------- decoding
def test_decoding_in_one_thread_and_in_many_gives_the_same_arrays(written, split):
    kw = {"columns": ["jpeg", "id"], "decoders": {"jpeg": ImageDecoder(*JPEG[:2])}}
    one = _epoch(split, decode_threads=1, num_workers=1, **kw)
    many = _epoch(split, decode_threads=4, num_workers=3, batch=6, **kw)
    a, b = _by_sample(one, "jpeg"), _by_sample(many, "jpeg")
    assert sorted(a) == list(range(N))
    for i in range(N):
        np.testing.assert_array_equal(a[i], b[i])
        np.testing.assert_array_equal(a[i], written["decoded"][i])  # JPEGs by simplejpeg; PNG and WebP lossless


def test_a_sample_that_does_not_decode_is_named(written, tmp_path):
    samples = dict(written["samples"])
    samples["jpeg"] = list(samples["jpeg"])
    samples["jpeg"][9] = b"\xff\xd8\xff not a jpeg"
    samples["jpeg"][11] = simplejpeg.encode_jpeg(np.zeros((8, 16, 3), np.uint8))  # another size
    manifest, _, paths = write_v2(tmp_path, COLUMNS, samples)
    bad = TypedSplit(manifest, paths, "train")
    kw = {"columns": ["jpeg"], "decoders": {"jpeg": ImageDecoder(*JPEG[:2])}, "epoch": 0, "seed": 0}
    with pytest.raises(DataError, match=r"loading batch 0 failed: column 'jpeg': cannot decode sample 9 "
                                        r"\(row 2 of shard 'train/00001.bin'\)"):
        list(TypedLoader(bad, np.array([8, 9, 10]), 3, 0, CPU, **kw))
    with pytest.raises(DataError, match=r"sample 11 \(row 4 of shard 'train/00001.bin'\).*decoded image is 8x16x3"):
        list(TypedLoader(bad, np.array([11]), 1, 0, CPU, **kw))


# ---------------------------------------------------------------- augmentation
def _reference_augment(image, top, left, flip, aug: ImageAugment):
    p = aug.padding
    padded = np.pad(image, ((p, p), (p, p), (0, 0)))
    h, w = aug.crop or image.shape[:2]
    window = padded[top:top + h, left:left + w]
    return window[:, ::-1] if flip else window


@pytest.mark.parametrize("aug", [ImageAugment(padding=4), ImageAugment(crop=(8, 7)),
                                 ImageAugment(crop=(14, 9), padding=2, hflip=False),
                                 ImageAugment(crop=(20, 18), padding=5)])
def test_augment_crops_pads_and_flips_like_the_reference(aug):
    images = np.random.default_rng(2).integers(1, 256, (40, *IMAGE), dtype=np.uint8)
    idx = np.arange(100, 140)
    draws = aug.draws(7, 1, idx, IMAGE)
    out = np.empty((40, *aug.output_shape(IMAGE)), np.uint8)
    aug.apply(images, draws, range(40), out)
    for i in range(40):
        ref = _reference_augment(images[i], draws.top[i], draws.left[i], draws.flip[i], aug)
        np.testing.assert_array_equal(out[i], ref)
    assert draws.flip.any() == aug.hflip and len(set(zip(draws.top.tolist(), draws.left.tolist()))) > 5


def test_random_words_depend_only_on_seed_epoch_and_index():
    idx = np.array([5, 17, 3, 10**9])
    words = sample_random_words(1, 2, idx, 3)
    np.testing.assert_array_equal(words[[2, 0]], sample_random_words(1, 2, idx[[2, 0]], 3))
    assert not (words == sample_random_words(1, 3, idx, 3)).any()
    assert not (words == sample_random_words(2, 2, idx, 3)).any()


def test_augmented_batches_do_not_depend_on_batching_workers_or_ranks(written, split):
    kw = {"columns": ["image", "jpeg", "id"], "decoders": {"jpeg": ImageDecoder(*JPEG[:2])},
          "augment": {"image": ImageAugment(crop=(8, 8), padding=2), "jpeg": ImageAugment(padding=3)}}
    base = _epoch(split, epoch=1, **kw)
    other = _epoch(split, epoch=1, world=2, batch=3, num_workers=2, decode_threads=3, **kw)
    for col in ("image", "jpeg"):
        a, b = _by_sample(base, col), _by_sample(other, col)
        assert sorted(a) == sorted(b) == list(range(N))
        for i in range(N):
            np.testing.assert_array_equal(a[i], b[i])
    next_epoch = _by_sample(_epoch(split, epoch=2, **kw), "image")
    assert any(not np.array_equal(next_epoch[i], _by_sample(base, "image")[i]) for i in range(N))
    reseeded = _by_sample(_epoch(split, epoch=1, seed=4, **kw), "image")
    assert any(not np.array_equal(reseeded[i], _by_sample(base, "image")[i]) for i in range(N))


def test_an_epoch_resumed_from_a_later_step_yields_the_same_batches(split):
    kw = {"columns": ["image", "label", "id"], "augment": {"image": ImageAugment(crop=(10, 8), padding=1)},
          "world": 2, "epoch": 3, "batch": 3}
    full = _epoch(split, **kw)  # rank 0's 4 batches, then rank 1's
    resumed = _epoch(split, start=2, **kw)
    assert len(resumed) == 4
    for got, want in zip(resumed, full[2:4] + full[6:8], strict=True):
        assert got["id"] == want["id"]
        for col in ("image", "label"):
            assert torch.equal(got[col], want[col])


# ---------------------------------------------------------------- loader
@pytest.mark.parametrize("world", [1, 4, 3])
def test_rank_shares_are_disjoint_and_cover_the_epoch(written, split, world):
    per_rank = []
    for rank in range(world):
        idx = epoch_indices(N, world, rank, 0, 3)
        batches = list(TypedLoader(split, idx, 2, 0, CPU, epoch=0, seed=3, columns=["id", "tokens", "label"]))
        for b in batches:
            np.testing.assert_array_equal(b["tokens"].numpy(), written["samples"]["tokens"][_ids(b)])
            assert b["tokens"].dtype == torch.int32 and b["label"].dtype == torch.int64
        per_rank.append([i for b in batches for i in _ids(b)])
    everything = [i for share in per_rank for i in share]
    assert set(everything) == set(range(N)) and len({len(s) for s in per_rank}) == 1
    assert len(everything) - N == (-N) % world  # only DistributedSampler's padding repeats


def test_loader_yields_input_and_target_columns_by_default_and_checks_its_settings(written, split):
    batch = next(iter(TypedLoader(split, np.arange(4), 4, 0, CPU, epoch=0, seed=0)))
    assert sorted(batch) == ["image", "jpeg", "label", "tokens"]
    assert batch["jpeg"] == written["samples"]["jpeg"][:4]  # no decoder: the encoded bytes
    with pytest.raises(ValueError, match="ndarray column: it needs no decoder"):
        TypedLoader(split, np.arange(4), 4, 0, CPU, epoch=0, seed=0, decoders={"image": ImageDecoder(12, 10)})
    with pytest.raises(ValueError, match="augmenting it needs a decoder"):
        TypedLoader(split, np.arange(4), 4, 0, CPU, epoch=0, seed=0, augment={"jpeg": ImageAugment()})
    with pytest.raises(ValueError, match="augmentation needs uint8 images"):
        TypedLoader(split, np.arange(4), 4, 0, CPU, epoch=0, seed=0, augment={"tokens": ImageAugment()})
    with pytest.raises(DataError, match="loading batch 0 failed: sample index out of range"):
        list(TypedLoader(split, np.array([0, N]), 2, 0, CPU, epoch=0, seed=0))


@pytest.mark.parametrize("start", [0, 3, 5])
def test_batches_loaded_several_at_a_time_are_the_batches_loaded_one_by_one(written, split, start):
    """Copy-only loaders load several small batches at once (one plan, one allocation, one
    hand-off between threads); the batches, their order and resuming are unchanged."""
    idx = epoch_indices(N, 1, 0, 4, 9)
    kw = {"epoch": 4, "seed": 9, "columns": ["tokens", "label", "id"], "num_workers": 2}
    grouped = TypedLoader(split, idx, 3, start, CPU, **kw)
    assert grouped.per_load == 16  # 3 samples of 44 bytes: far below a load's worth
    single = TypedLoader(split, idx, 3, start, CPU, batches_per_load=1, **kw)
    got, want = list(grouped), list(single)
    assert len(got) == len(want) == 7 - start
    for g, w in zip(got, want, strict=True):
        assert g["id"] == w["id"] and torch.equal(g["tokens"], w["tokens"]) and torch.equal(g["label"], w["label"])
        np.testing.assert_array_equal(g["tokens"].numpy(), written["samples"]["tokens"][_ids(g)])
    with pytest.raises(DataError, match=r"loading batches 0-6 failed: sample index out of range"):
        list(TypedLoader(split, np.append(idx, N), 3, 0, CPU, **kw))


def test_output_memory_is_reused_only_once_no_batch_refers_to_it(written, split):
    """CPU batches are filled into blocks that come back once their batches are dropped; a batch
    still held (or a numpy view of it) is never overwritten."""
    s = written["samples"]
    kw = {"columns": ["tokens", "jpeg", "id"], "decoders": {"jpeg": ImageDecoder(*JPEG[:2])}, "seed": 1}
    held, view = None, None
    for epoch in range(3):
        idx = epoch_indices(N, 1, 0, epoch, 1)
        for b in TypedLoader(split, idx, 4, 0, CPU, epoch=epoch, num_workers=2, **kw):
            ids = _ids(b)
            np.testing.assert_array_equal(b["tokens"].numpy(), s["tokens"][ids])
            np.testing.assert_array_equal(b["jpeg"].numpy(), written["decoded"][ids])
            if held is None:
                held, view = b, b["jpeg"][1:].numpy()
    ids = _ids(held)
    np.testing.assert_array_equal(held["tokens"].numpy(), s["tokens"][ids])
    np.testing.assert_array_equal(view, written["decoded"][ids[1:]])


def test_uint16_token_windows(tmp_path):
    tokens = np.random.default_rng(3).integers(0, 65_536, (30, 129)).astype(np.uint16)
    manifest, _, paths = write_v2(tmp_path, [Column("tokens", "ndarray", "input", "uint16", (129,))],
                                  {"tokens": tokens}, sizes=(16, 14))
    lm = open_split(manifest, paths, "train")
    batches = list(TypedLoader(lm, epoch_indices(30, 1, 0, 0, 0), 8, 0, CPU, epoch=0, seed=0, num_workers=2))
    assert batches[0]["tokens"].dtype == torch.uint16
    got = np.concatenate([b["tokens"].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(tokens, axis=0))


# ---------------------------------------------------------------- both formats
def test_open_split_reads_v1_manifests_as_typed_columns(tmp_path, written):
    manifest, locations = make_dataset(tmp_path, n_train=30, n_test=5, feature_shape=(2, 3), per_shard=8)
    v1 = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    assert isinstance(v1, TypedSplit) and v1.num_samples == 30
    got = v1.gather(np.array([29, 0, 8]))
    x, y = got["features"], got["label"]
    assert x.shape == (3, 2, 3) and y.dtype == np.int64
    assert isinstance(open_split(written["manifest"], written["paths"], "train"), TypedSplit)
    with pytest.raises(DataError, match="manifest format 'model-factory.shards/v9' is neither"):
        open_split(dict(manifest, format="model-factory.shards/v9"), [], "train")
