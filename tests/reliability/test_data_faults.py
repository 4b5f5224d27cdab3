"""Data beyond one node under faults (issue 41, item 6), each a class of the reliability report:

- the S3 store going down while a training streams its shards: retried, then a failure that
  names the shard and the endpoint, and a relaunch after the store is back resumes from the last
  checkpoint and trains every step once;
- a shard corrupted in the store: the run stops naming the shard and both sha256, and the bad
  bytes never enter the cache;
- the cache's disk filling up while a training streams: an error naming data.cache_limit and
  data.cache_dir (a tmpfs of 4 MiB filled by another writer);
- a worker killed while it shards its step's parts: the step is retried alone and the version
  holds every image once;
- a table's shard step pod killed (the step pod simulation, tests/k8s/test_step_pods.py): the
  step is retried alone in a new pod and the version is the single-step build, byte for byte;
- a table's ingest step pod killed (tests/k8s/test_table_ingest_pods.py), one of four groups of
  files: retried alone in a new pod, the raw copy one commit and one step's, byte for byte.

Real SeaweedFS, real torchrun, real Dagster; nothing lost means every optimizer step trained once
and the dataset version holds exactly the folder's images.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.k8s.test_step_pods import step_pods, table_step_pod_killed  # noqa: F401  (step_pods: a fixture)
from tests.k8s.test_table_ingest_pods import table_ingest_pod_killed
from tests.pipeline.conftest import platform  # noqa: F401  (a fixture)
from tests.runtime.helpers import make_dataset, torchrun
from tests.runtime.test_stream_s3 import s3, split_bytes, streaming_config, upload  # noqa: F401  (s3: a fixture)
from tests.support.fault_proxy import FaultProxy

pytestmark = pytest.mark.slow


def _when_checkpointed(config: dict, step: int, then) -> threading.Thread:
    def wait() -> None:
        deadline = time.monotonic() + 240
        while not (Path(config["checkpoint"]["dir"]) / f"step_{step:09d}").exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        then()
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _metrics(config: dict) -> dict:
    return json.loads((Path(config["output_dir"]) / "metrics.json").read_text())


def test_s3_down_mid_stream_fails_by_name_and_the_relaunch_resumes(s3, tmp_path, ledger):  # noqa: F811
    manifest, locations = make_dataset(tmp_path / "src", n_train=480, n_test=40, per_shard=20)
    remote = upload(s3, locations, "outage")
    limit = sum(split_bytes(manifest)) // 4  # the ranks keep fetching as they read: the outage is felt
    with FaultProxy(s3.endpoint_url) as proxy:
        endpoint = proxy.url
        config = streaming_config(tmp_path, s3, manifest, remote, endpoint, limit, name="outage")
        config["data"]["shuffle_block"] = 2
        env = {"TRAINING_RUNTIME_FAULT_SLOW_RANK": "0:0.15"}  # ~30 steps an epoch at a few a second
        outage = _when_checkpointed(config, 8, lambda: proxy.outage(75))
        first = torchrun(config, tmp_path / "outage.json", env=env, timeout=300)
        outage.join(timeout=120)  # the store is back
        second = torchrun(config, tmp_path / "outage.json", env=env, timeout=300)
    named = "cannot fetch shard" in first.stderr and endpoint in first.stderr
    metrics = _metrics(config) if second.returncode == 0 else {}
    resumed = [a for a in metrics.get("attempts", []) if a.get("resumed_from_step")]
    ok = first.returncode != 0 and named and second.returncode == 0
    lost_nothing = bool(resumed) and metrics.get("steps") == metrics.get("total_steps")
    ledger.record("data: S3 down mid-stream", ok, lost_nothing,
                  "retried, then a named failure; the relaunch resumed from its checkpoint")
    assert first.returncode != 0 and named, first.stderr[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    assert lost_nothing, metrics.get("attempts")


def test_a_shard_corrupted_in_the_store_is_named_by_its_sha256(s3, tmp_path, ledger):  # noqa: F811
    manifest, locations = make_dataset(tmp_path / "src", n_train=160, n_test=40, per_shard=20)
    remote = upload(s3, locations, "corrupt")
    entry = manifest["splits"]["train"]["shards"][3]
    key = remote[entry["path"]].removeprefix(f"s3://{s3.bucket}/")
    client = s3.client()
    data = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, the size unchanged
    client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))
    config = streaming_config(tmp_path, s3, manifest, remote, s3.endpoint_url, 10**9, name="corrupt")

    proc = torchrun(config, tmp_path / "corrupt.json", timeout=300)

    import hashlib

    bad = hashlib.sha256(bytes(data)).hexdigest()
    named = f"checksum mismatch for shard '{entry['path']}'" in proc.stderr and bad in proc.stderr \
        and entry["sha256"] in proc.stderr
    cached = [p for p in Path(config["data"]["cache_dir"]).rglob("*.bin")]
    clean = all(p.name != f"{bad}.bin" for p in cached)
    ledger.record("data: a shard corrupted in the store", proc.returncode != 0 and named, clean,
                  "named by both sha256; the bad bytes never cached")
    assert proc.returncode != 0 and named, proc.stderr[-3000:]
    assert clean


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_cache_disk_that_fills_up_names_data_cache_limit(s3, tmp_path, small_disk, ledger):  # noqa: F811
    manifest, locations = make_dataset(tmp_path / "src", n_train=640, n_test=40, per_shard=20)
    remote = upload(s3, locations, "full")
    limit = 3 * 2**20  # fits the 4 MiB disk when training starts
    config = streaming_config(tmp_path, s3, manifest, remote, s3.endpoint_url, limit, name="full")
    config["data"]["cache_dir"] = str(small_disk / "cache")

    def fill() -> None:  # another writer takes what is left of the disk
        with open(small_disk / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass

    filler = _when_checkpointed(config, 4, fill)
    proc = torchrun(config, tmp_path / "full.json", env={"TRAINING_RUNTIME_FAULT_SLOW_RANK": "0:0.1"}, timeout=300)
    filler.join(timeout=30)
    named = "data.cache_limit" in proc.stderr and "data.cache_dir" in proc.stderr and "disk is full" in proc.stderr
    partial = list((small_disk / "cache").rglob(".*.part"))
    ledger.record("data: a full cache disk", proc.returncode != 0 and named, not partial,
                  "names data.cache_limit and data.cache_dir; no partial shard left")
    assert proc.returncode != 0 and named, proc.stderr[-3000:]
    assert not partial


def test_a_worker_killed_while_sharding_its_parts_is_retried_alone(platform, tmp_path, monkeypatch,  # noqa: F811
                                                                   ledger):
    from core.datasets import dataset_tags
    from core.spec import ImageFolder, ImagePreprocessing
    from pipelines.models.shapes import shapes_dataset, write_shapes_source
    from tests.data.test_images import read_shards
    from tests.pipeline.conftest import failure_messages

    package = tmp_path / "dying_prep"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        import os, signal
        import numpy as np

        MARKER = {str(tmp_path / "killed-once")!r}
        TEST_PROCESS = {os.getpid()}  # a step small enough to run without its pool runs here: not killed

        def crop(img):
            if os.getpid() != TEST_PROCESS:
                try:  # the first call in a pool worker kills that worker, as the OOM killer would
                    os.close(os.open(MARKER, os.O_CREAT | os.O_EXCL))
                    os.kill(os.getpid(), signal.SIGKILL)
                except FileExistsError:
                    pass
            return np.asarray(img.convert("RGB").resize((32, 32)), dtype=np.uint8)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = write_shapes_source(platform.sources, per_class=60, seed=5)
    # about 40 images a part, 2 parts a step: each step has more than a task's worth, so a pool
    spec = dataclasses.replace(shapes_dataset, source=ImageFolder(root="shapes", files_per_part=40, parts_per_step=2),
                               preprocessing=ImagePreprocessing(size=(32, 32), function="dying_prep:crop"))

    result = platform.run(spec)

    steps = [e.step_key for e in result.all_events if e.is_step_success and "_shard_parts[" in e.step_key]
    restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
    store = platform.store()
    ok = result.success and len(restarted) == 1 and restarted[0] in steps and len(steps) >= 2
    held = []
    if result.success:
        manifest = json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))
        held = sorted(i for ids, _, _ in read_shards(store, manifest, tmp_path / "read").values() for i in ids)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    ledger.record("data: a partition's worker killed", ok, held == files,
                  "the step retried alone; every image once in the version")
    assert result.success, failure_messages(result)
    assert len(restarted) == 1 and restarted[0] in steps and len(steps) >= 2, (restarted, steps)
    assert held == files and set(dataset_tags(store, "shapes")) == {1}


def test_a_tables_shard_step_pod_killed_is_retried_alone(step_pods, tmp_path, ledger):  # noqa: F811
    alone, whole, why = table_step_pod_killed(step_pods, tmp_path)
    ledger.record("data: a table partition's pod killed", alone, whole,
                  "the step retried alone in a new pod; the version the single-step build, byte for byte")
    assert alone and whole, why


def test_a_tables_ingest_step_pod_killed_is_retried_alone(step_pods, tmp_path, ledger):  # noqa: F811
    alone, whole, why = table_ingest_pod_killed(step_pods, tmp_path)
    ledger.record("data: a table's ingest pod killed", alone, whole,
                  "the group retried alone in a new pod; the raw copy one commit, one step's byte for byte")
    assert alone and whole, why
