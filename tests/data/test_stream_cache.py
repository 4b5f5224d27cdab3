"""The shard cache's policy (data/cache.py) on real shard files: the schedule derived from any
order, on-demand fetch and read-ahead, eviction behind the reader (Belady when over budget), the
budget refusals, corrupt shards named by sha256, a full disk naming data.cache_limit, and reuse of
what an earlier attempt cached. The store is a stand-in fetcher serving the shard files' bytes;
tests/runtime/test_stream_s3.py streams from a real S3 server."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from training_runtime.data import cache as cache_mod
from training_runtime.data.cache import (
    CacheFullError,
    CorruptShardError,
    Schedule,
    ShardCache,
    ShardFetchError,
    ShardRef,
    shard_refs,
)
from training_runtime.data.loader import TypedLoader
from training_runtime.data.sampling import sorted_batches
from training_runtime.data.shards import DataError, resolve_shards
from training_runtime.data.split import open_split, open_streaming_split
from tests.runtime.helpers import make_dataset
from tests.runtime.typed_datasets import make_images, make_tokens


class StoreFetcher:
    """Serves s3://store/<path> from files under ``root``, as S3 would, counting requests."""

    def __init__(self, root: Path, chunk: int = 4096):
        self.root, self.chunk = root, chunk
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.endpoint_url = "http://store.test"

    def fetch(self, ref: ShardRef, sink) -> int:
        with self.lock:
            self.requests.append(ref.name)
        data = (self.root / ref.url.removeprefix("s3://store/")).read_bytes()
        for i in range(0, len(data), self.chunk):
            sink(data[i:i + self.chunk])
        return 1


def s3_locations(locations: dict[str, str]) -> dict[str, str]:
    return {rel: f"s3://store/{rel}" for rel in locations}


def stream(tmp_path, manifest, locations, split, limit, read_ahead=2, name="cache"):
    fetcher = StoreFetcher(tmp_path / "src")
    cache = ShardCache(tmp_path / name, limit, read_ahead, fetcher=fetcher)
    refs = shard_refs(manifest, s3_locations(locations), split)
    return open_streaming_split(manifest, refs, split, cache), cache, fetcher


def shard_bytes(manifest, split):
    return [s["num_bytes"] for s in manifest["splits"][split]["shards"]]


def shard_ordered(starts: np.ndarray, seed: int) -> np.ndarray:
    """An order that reads shard after shard (shards permuted, samples shuffled inside each), as a
    shard-aware sampler does: any order works, this one lets a small cache hold what is read."""
    rng = np.random.default_rng(seed)
    parts = [rng.permutation(np.arange(starts[s], starts[s + 1])) for s in rng.permutation(len(starts) - 1)]
    return np.concatenate(parts)


def test_the_schedule_holds_each_shards_first_and_last_read_for_any_order():
    starts = np.array([0, 10, 20, 30])
    batches = [np.array([0, 1, 25]), np.array([11, 12]), np.array([2, 29]), np.array([13])]
    s = Schedule(["a", "b", "c"], starts, batches)
    assert s.first_last() == {"a": (0, 2), "b": (1, 3), "c": (0, 2)}
    assert s.next_use("a") == 0
    s.done[[0, 1]] = True
    assert (s.next_use("a"), s.next_use("b"), s.next_use("c")) == (2, 3, 2)
    s.done[2] = True
    assert s.next_use("a") is None and s.next_use("b") == 3


def load_all(split, idx, batch_size=16, **kw):
    loader = TypedLoader(split, idx, batch_size, 0, torch.device("cpu"), epoch=0, seed=0, **kw)
    try:
        return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in loader]
    finally:
        loader.close()


@pytest.mark.parametrize("kind", ["table", "images", "jpeg", "tokens"])
def test_a_cache_a_quarter_of_the_split_streams_the_same_batches_as_reading_in_place(tmp_path, kind):
    src = tmp_path / "src"
    if kind == "table":
        manifest, locations = make_dataset(src, n_train=320, per_shard=20)
        columns = None
    elif kind == "tokens":
        manifest, locations = make_tokens(src, sizes=(320, 24, 24))
        columns = ["tokens"]
    else:
        manifest, locations = make_images(src, sizes=(320, 32, 32), encoded=kind == "jpeg")
        columns = ["jpeg" if kind == "jpeg" else "image", "label"]
    sizes = shard_bytes(manifest, "train")
    limit = max(sum(sizes) // 4, 2 * max(sizes))
    assert limit < sum(sizes)
    local = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    streamed, cache, fetcher = stream(tmp_path, manifest, locations, "train", limit)
    idx = shard_ordered(local.starts, seed=3)
    decoders = {}
    if kind == "jpeg":
        from training_runtime.data.decode import ImageDecoder

        decoders = {"jpeg": ImageDecoder(16, 16, 3)}
    want = load_all(local, idx, columns=columns, decoders=decoders)
    got = load_all(streamed, idx, columns=columns, decoders=decoders)
    for a, b in zip(want, got, strict=True):
        for k in a:
            if isinstance(a[k], torch.Tensor):
                torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
            else:
                assert a[k] == b[k]
    stats = cache.stats
    assert stats.peak_bytes <= limit
    assert stats.fetches == len(sizes) and stats.refetches == 0  # each shard fetched once, in order
    assert stats.bytes_fetched == sum(sizes)
    assert stats.evictions >= len(sizes) - limit // min(sizes)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "cache").glob("*.bin"))
    assert on_disk <= limit
    cache.close()


def test_evicted_shards_are_unmapped_before_their_files_go(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=200, per_shard=20)
    sizes = shard_bytes(manifest, "train")
    split, cache, _ = stream(tmp_path, manifest, locations, "train", 3 * max(sizes), read_ahead=0)
    for s in range(len(sizes)):
        split.gather(np.arange(split.starts[s], split.starts[s + 1]))
    open_now = [s for s, sh in enumerate(split._shards) if sh is not None]
    files = sorted(p.stem for p in (tmp_path / "cache").glob("*.bin"))
    assert sorted(split._refs[s].sha256 for s in open_now) == files
    assert len(files) <= 3 and cache.stats.evictions == len(sizes) - len(files)
    assert all(split._rows["features"].arrays[s] is None for s in range(len(sizes)) if s not in open_now)
    cache.close()


def test_over_budget_the_shard_read_furthest_in_the_future_is_evicted(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=20)
    sizes = shard_bytes(manifest, "train")
    split, cache, fetcher = stream(tmp_path, manifest, locations, "train", 3 * max(sizes), read_ahead=0)
    # Reads shards 0 1 2 3 0 1 2: with room for three, reading 3 must evict 2 (read last), not 0.
    order = [0, 1, 2, 3, 0, 1, 2]
    batches = [np.arange(split.starts[s], split.starts[s] + 4) for s in order]
    schedule = split.plan_reads(batches)
    for pos, b in enumerate(batches):
        split.gather(b)
        split.reads_done(schedule, [pos])
    assert fetcher.requests == [manifest["splits"]["train"]["shards"][s]["path"] for s in (0, 1, 2, 3, 2)]
    cache.close()


def test_read_ahead_fetches_the_next_shards_in_schedule_order_before_they_are_read(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=200, per_shard=20)
    sizes = shard_bytes(manifest, "train")
    split, cache, fetcher = stream(tmp_path, manifest, locations, "train", 4 * max(sizes), read_ahead=2)
    order = [7, 2, 9, 0]
    batches = [np.arange(split.starts[s], split.starts[s] + 5) for s in order]
    split.plan_reads(batches)
    names = [manifest["splits"]["train"]["shards"][s]["path"] for s in order]
    deadline = threading.Event()
    for _ in range(100):
        if len(fetcher.requests) >= 2:
            break
        deadline.wait(0.05)
    assert fetcher.requests[:2] == names[:2]  # nothing read yet: two ahead, in the order they will be read
    deadline.wait(0.3)
    assert len(fetcher.requests) == 2  # read_ahead=2 shards wait unread: no more
    cache.close()


def test_a_load_whose_shards_cannot_fit_together_is_refused_naming_data_cache_limit(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=200, per_shard=20)
    sizes = shard_bytes(manifest, "train")
    split, cache, _ = stream(tmp_path, manifest, locations, "train", 3 * max(sizes))
    idx = np.random.default_rng(0).permutation(200)  # every batch reads almost every shard
    with pytest.raises(DataError, match=r"one load reads \d+ shards .* data\.cache_limit"):
        load_all(split, idx, batch_size=64)
    cache.close()


def test_a_shard_larger_than_the_budget_is_refused_before_any_read(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=50)
    size = max(shard_bytes(manifest, "train"))
    with pytest.raises(CacheFullError, match=rf"is {size} bytes, more than this rank's share of data\.cache_limit"):
        stream(tmp_path, manifest, locations, "train", size - 1)


def test_a_shard_corrupt_in_the_store_is_named_with_its_sha256_and_never_enters_the_cache(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=20)
    entry = manifest["splits"]["train"]["shards"][1]
    path = tmp_path / "src" / entry["path"]
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    split, cache, _ = stream(tmp_path, manifest, locations, "train", 10 * entry["num_bytes"])
    split.gather(np.arange(0, 20))
    with pytest.raises(CorruptShardError, match=rf"checksum mismatch for shard '{entry['path']}' at s3://store/"
                                                rf"{entry['path']}: sha256 [0-9a-f]{{64}} != manifest {entry['sha256']}; "
                                                "the shard is corrupt in the store"):
        split.gather(np.arange(20, 40))
    assert not (tmp_path / "cache" / f"{entry['sha256']}.bin").exists()
    assert not list((tmp_path / "cache").glob(".*.part"))
    cache.close()


def test_a_full_cache_disk_is_an_error_naming_data_cache_limit_and_the_cache_dir(tmp_path, monkeypatch):
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=20)
    split, cache, _ = stream(tmp_path, manifest, locations, "train", 10**9)
    real_open = open

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def full_open(path, mode="r", *args, **kw):
        f = real_open(path, mode, *args, **kw)
        return FullDisk(f) if "w" in mode and str(path).endswith(".part") else f

    monkeypatch.setattr(cache_mod, "open", full_open, raising=False)
    with pytest.raises(CacheFullError, match=rf"disk is full writing shard .* into {tmp_path / 'cache'} .*"
                                             r"data\.cache_limit \(1000000000 bytes for this rank\)"):
        split.gather(np.arange(0, 5))
    assert not list((tmp_path / "cache").iterdir())
    cache.close()


def test_a_retry_reuses_the_verified_shards_an_earlier_attempt_cached_and_refetches_a_damaged_one(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=20)
    split, cache, fetcher = stream(tmp_path, manifest, locations, "train", 10**9, read_ahead=0)
    want = split.gather(np.arange(100))["features"]
    cache.close()
    assert len(fetcher.requests) == 5
    damaged = manifest["splits"]["train"]["shards"][3]
    p = tmp_path / "cache" / f"{damaged['sha256']}.bin"
    p.write_bytes(b"\0" * damaged["num_bytes"])
    again, cache2, fetcher2 = stream(tmp_path, manifest, locations, "train", 10**9, read_ahead=0)
    np.testing.assert_array_equal(again.gather(np.arange(100))["features"], want)
    assert fetcher2.requests == [damaged["path"]]
    assert cache2.stats.reused == 4 and cache2.stats.bytes_fetched == damaged["num_bytes"]
    cache2.close()


def test_local_shards_are_read_in_place_and_checked_once_when_first_read(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=20)
    entry = manifest["splits"]["train"]["shards"][2]
    cache = ShardCache(None, 1)
    split = open_streaming_split(manifest, shard_refs(manifest, locations, "train"), "train", cache)
    split.gather(np.arange(0, 40))
    split.gather(np.arange(0, 40))
    assert cache.stats.local_verified == 2
    path = tmp_path / "src" / entry["path"]
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=rf"checksum mismatch for shard '{entry['path']}'"):
        split.gather(np.arange(40, 60))
    with pytest.raises(DataError, match="data.cache_dir is required for s3:// shards"):
        open_streaming_split(manifest, shard_refs(manifest, s3_locations(locations), "train"), "train", cache)


def test_a_store_that_keeps_failing_is_a_named_failure_after_the_retries(tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=40, per_shard=20)

    class Down(cache_mod.S3Fetcher):
        def client(self):
            from botocore.exceptions import EndpointConnectionError

            class Client:
                def get_object(self, **kw):
                    raise EndpointConnectionError(endpoint_url="http://store.test")
            return Client()

    fetcher = Down("http://store.test", attempts=3, backoff_s=(0,))
    cache = ShardCache(tmp_path / "cache", 10**9, 0, fetcher=fetcher)
    split = open_streaming_split(manifest, shard_refs(manifest, s3_locations(locations), "train"), "train", cache)
    with pytest.raises(ShardFetchError, match=r"cannot fetch shard 'shards/train/00000.bin' from s3://store/shards/"
                                              r"train/00000.bin \(endpoint http://store.test, 3 attempt\(s\)\).*"
                                              r"data\.s3_endpoint_url"):
        split.gather(np.arange(5))
    cache.close()


def test_the_next_epochs_schedule_keeps_its_first_shards_from_eviction_order(tmp_path):
    """Two loaders' schedules at once (chained epochs): shards the next epoch reads first are not
    evicted before those it reads later."""
    manifest, locations = make_dataset(tmp_path / "src", n_train=100, per_shard=20)
    split, cache, _ = stream(tmp_path, manifest, locations, "train", 10**9, read_ahead=0)
    starts = split.starts
    one = split.plan_reads([np.arange(starts[s], starts[s] + 2) for s in (0, 1)])
    two = split.plan_reads([np.arange(starts[s], starts[s] + 2) for s in (4, 0)])
    key = [r.sha256 for r in split._refs]
    assert cache._next_use(key[0]) == (one.seq, 0)
    cache.done(one, [0, 1])
    assert cache._next_use(key[0]) == (two.seq, 1) and cache._next_use(key[1]) is None
    cache.close()


def test_a_connection_cut_mid_body_resumes_with_a_range_request_for_the_missing_bytes(tmp_path):
    from urllib3.exceptions import ProtocolError

    manifest, locations = make_dataset(tmp_path / "src", n_train=40, per_shard=20)
    entry = manifest["splits"]["train"]["shards"][0]
    data = (tmp_path / "src" / entry["path"]).read_bytes()
    asked = []

    class Body:
        def __init__(self, part: bytes, cut: bool):
            self.part, self.cut = part, cut

        def iter_chunks(self, size):
            yield self.part[:len(self.part) // 2]
            if self.cut:
                raise ProtocolError("Connection broken: IncompleteRead")
            yield self.part[len(self.part) // 2:]

        def close(self):
            pass

    class Cutting(cache_mod.S3Fetcher):
        def client(self):
            class Client:
                def get_object(self, Bucket, Key, Range=None):
                    asked.append(Range)
                    start = int(Range.removeprefix("bytes=").rstrip("-")) if Range else 0
                    return {"Body": Body(data[start:], cut=len(asked) == 1)}
            return Client()

    cache = ShardCache(tmp_path / "cache", 10**9, 0, fetcher=Cutting("http://store.test", backoff_s=(0,)))
    split = open_streaming_split(manifest, shard_refs(manifest, s3_locations(locations), "train"), "train", cache)
    local = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    np.testing.assert_array_equal(split.gather(np.arange(20))["features"], local.gather(np.arange(20))["features"])
    assert asked == [None, f"bytes={len(data) // 2}-"]
    assert cache.stats.bytes_fetched == len(data)
    cache.close()
