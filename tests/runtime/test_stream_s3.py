"""Streaming shards from a real S3 server (SeaweedFS): training with a cache a quarter of the
split, every kind of shard (tables, images, tokens) through the loader, connections cut while
shards stream (retried), and a store that stays down (a named failure)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from training_runtime.data.cache import S3Fetcher, ShardCache, ShardFetchError, shard_refs
from training_runtime.data.loader import TypedLoader
from training_runtime.data.shards import resolve_shards
from training_runtime.data.split import open_split, open_streaming_split
from tests.runtime.helpers import make_config, make_dataset, torchrun
from tests.runtime.typed_datasets import make_images, make_tokens
from tests.support.fault_proxy import FaultProxy
from tests.support.ports import free_ports
from tests.support.seaweed import SeaweedServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = SeaweedServer(tmp_path_factory.mktemp("weed"), bucket="shards")
    creds = {"AWS_ACCESS_KEY_ID": server.access_key_id, "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
             "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    try:
        with server:
            yield server
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upload(s3, locations: dict[str, str], prefix: str) -> dict[str, str]:
    client = s3.client()
    out = {}
    for rel, url in locations.items():
        client.upload_file(url.removeprefix("file://"), s3.bucket, f"{prefix}/{rel}")
        out[rel] = f"s3://{s3.bucket}/{prefix}/{rel}"
    return out


def split_bytes(manifest, split="train") -> list[int]:
    return [s["num_bytes"] for s in manifest["splits"][split]["shards"]]


def shard_ordered(starts: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(np.arange(starts[s], starts[s + 1]))
                           for s in rng.permutation(len(starts) - 1)])


@pytest.mark.parametrize("kind", ["table", "images", "tokens"])
def test_every_kind_of_shard_streams_from_s3_within_a_quarter_of_the_split(s3, tmp_path, kind):
    src = tmp_path / "src"
    if kind == "table":
        manifest, locations = make_dataset(src, n_train=320, per_shard=20)
    elif kind == "tokens":
        manifest, locations = make_tokens(src, sizes=(320, 24, 24))
    else:
        manifest, locations = make_images(src, sizes=(320, 32, 32), encoded=True)
    remote = upload(s3, locations, f"kinds-{kind}")
    sizes = split_bytes(manifest)
    limit = max(sum(sizes) // 4, 2 * max(sizes))
    assert limit < sum(sizes)
    cache = ShardCache(tmp_path / "cache", limit, 2, s3.endpoint_url)
    streamed = open_streaming_split(manifest, shard_refs(manifest, remote, "train"), "train", cache)
    local = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    idx = shard_ordered(local.starts, seed=1)
    cols = [c for c in local.columns if local.columns[c].kind == "ndarray"]
    loaders = [TypedLoader(s, idx, 16, 0, torch.device("cpu"), epoch=0, seed=0, columns=cols) for s in (local, streamed)]
    for a, b in zip(*loaders, strict=True):
        for k in cols:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    for loader in loaders:
        loader.close()
    # the jpeg column through the loader's views (decoding reads the memory map in place)
    if kind == "images":
        for s in range(len(sizes)):
            rows = np.arange(local.starts[s], local.starts[s + 1], 3)
            assert streamed.gather(rows, ["jpeg"])["jpeg"] == local.gather(rows, ["jpeg"])["jpeg"]
    assert cache.stats.peak_bytes <= limit
    assert cache.stats.bytes_fetched >= sum(sizes) and cache.stats.evictions > 0
    cache.close()


def streaming_config(tmp_path, s3, manifest, remote, endpoint, limit, name="run"):
    config = make_config(tmp_path, manifest, remote, name=name, epochs=2, batch_size=16)
    config["data"].update(s3_endpoint_url=endpoint, cache_limit=limit, read_ahead=2,
                          cache_dir=str(tmp_path / name / "cache"))
    return config


def test_training_streams_from_s3_with_a_cache_a_quarter_of_the_split(s3, tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=640, n_test=40, per_shard=20)
    remote = upload(s3, locations, "train-run")
    sizes = split_bytes(manifest)
    limit = sum(sizes) // 4  # for the node: each of its 2 ranks gets half, 4 shards
    config = streaming_config(tmp_path, s3, manifest, remote, s3.endpoint_url, limit)
    config["data"]["shuffle_block"] = 2  # a batch reads 2-3 shards: room for one ahead
    config["validation"] = {"every_steps": 10}
    proc = torchrun(config, tmp_path / "run.json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((tmp_path / "run" / "out" / "metrics.json").read_text())
    assert metrics["steps"] == metrics["total_steps"] > 0
    assert all(0 < p <= limit // 2 for p in metrics["per_rank_cache_peak_bytes"]), metrics
    assert metrics["cache_evictions"] > 0
    # two epochs over the train split and the validation split: each rank fetched its own shards
    assert metrics["data_bytes_fetched"] >= sum(sizes)
    for rank in (0, 1):
        left = list((tmp_path / "run" / "cache" / f"rank-{rank}").glob("*.bin"))
        assert sum(p.stat().st_size for p in left) <= limit // 2
        assert not list((tmp_path / "run" / "cache" / f"rank-{rank}").glob(".*.part"))


def test_connections_cut_while_shards_stream_are_retried(s3, tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=160, n_test=40, per_shard=20)
    remote = upload(s3, locations, "cut")
    sizes = split_bytes(manifest)
    with FaultProxy(s3.endpoint_url) as proxy:
        cache = ShardCache(tmp_path / "cache", 4 * max(sizes), 2, proxy.url)
        split = open_streaming_split(manifest, shard_refs(manifest, remote, "train"), "train", cache)
        local = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
        proxy.inject("reset", 3)
        proxy.inject("503", 2)
        proxy.inject("reset-after", 1)
        for s in range(len(sizes)):
            rows = np.arange(local.starts[s], local.starts[s + 1])
            np.testing.assert_array_equal(split.gather(rows)["features"], local.gather(rows)["features"])
        assert len(proxy.faults_served) == 6
        cache.close()


def test_an_s3_store_that_stays_down_fails_the_run_naming_the_shard_and_the_endpoint(s3, tmp_path):
    manifest, locations = make_dataset(tmp_path / "src", n_train=64, n_test=16, per_shard=16)
    remote = upload(s3, locations, "down")
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    fetcher = S3Fetcher(dead, attempts=2, backoff_s=(0.1,))
    cache = ShardCache(tmp_path / "cache", 10**9, 0, dead, fetcher=fetcher)
    split = open_streaming_split(manifest, shard_refs(manifest, remote, "train"), "train", cache)
    with pytest.raises(ShardFetchError, match=rf"cannot fetch shard 'shards/train/00000.bin' from {remote['shards/train/00000.bin']} "
                                              rf"\(endpoint {dead}, 2 attempt\(s\)\): the store is down or unreachable"):
        split.gather(np.arange(4))
    cache.close()
    config = streaming_config(tmp_path, s3, manifest, remote, dead, 10**9, name="down")
    proc = torchrun(config, tmp_path / "down.json", timeout=300)
    assert proc.returncode != 0
    assert "cannot fetch shard" in proc.stderr and dead in proc.stderr and "data.s3_endpoint_url" in proc.stderr, \
        proc.stderr[-4000:]
