"""Least-privilege S3 keys on a real SeaweedFS that enforces them (its S3 identity configuration):
the training key reads the shards and writes only its run's checkpoint prefix, the orchestrator
key writes what it publishes, a key with no grant is refused; every refusal names the key, the
permission it lacks and where the key may act instead, never the secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.artifacts.base import ArtifactError
from resources.artifacts.key_scope import orchestrator_scope, training_scope
from resources.artifacts.s3 import S3ArtifactStore
from tests.support.seaweed import SeaweedServer, seaweed_identity
from training_runtime.data.shards import DataError, resolve_shards

BUCKET, PREFIX, MODEL = "test-bucket", "artifacts", "digits"
SHARDS = f"{BUCKET}/datasets/digits/c1/"
TRAINING = training_scope(BUCKET, PREFIX, MODEL, "run-1", (SHARDS,))
ORCHESTRATOR = orchestrator_scope(BUCKET, PREFIX)
KEYS = {  # access key id -> secret; secrets are planted so the tests can look for them in messages
    "AKTRAINING": "planted-training-SECRET-0123",
    "AKORCHESTRATOR": "planted-orchestrator-SECRET-4567",
    "AKNOGRANT": "planted-nogrant-SECRET-89ab",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One SeaweedFS for the module with the three keys, and another run's published weights."""
    identities = [seaweed_identity("training", "AKTRAINING", KEYS["AKTRAINING"], TRAINING),
                  seaweed_identity("orchestrator", "AKORCHESTRATOR", KEYS["AKORCHESTRATOR"], ORCHESTRATOR),
                  seaweed_identity("no-grant", "AKNOGRANT", KEYS["AKNOGRANT"], None)]
    with SeaweedServer(tmp_path_factory.mktemp("key-scopes"), identities=identities) as s3:
        s3.client().put_object(Bucket=BUCKET, Key=f"{PREFIX}/models/{MODEL}/checkpoints/run-0/model.safetensors",
                               Body=b"w0")
        yield s3
        s3.stop(grace_s=0.5)  # nothing reads its data afterwards


@pytest.fixture(scope="module")
def shards(server, tmp_path_factory):
    """A small shard set uploaded with the admin key: (manifest, s3:// location of each shard)."""
    from tests.runtime.helpers import make_dataset

    manifest, files = make_dataset(tmp_path_factory.mktemp("shards"), n_train=32, n_test=8, per_shard=16)
    locations = {}
    for rel, url in files.items():
        key = SHARDS.removeprefix(f"{BUCKET}/") + rel
        server.client().upload_file(url.removeprefix("file://"), BUCKET, key)
        locations[rel] = f"s3://{BUCKET}/{key}"
    return manifest, locations


def store(server: SeaweedServer, key: str, scope=None, prefix: str = PREFIX, **kwargs) -> S3ArtifactStore:
    return S3ArtifactStore(BUCKET, prefix=prefix, endpoint_url=server.endpoint_url, region="us-east-1",
                           access_key_id=key, secret_access_key=KEYS.get(key, "unknown-secret"), scope=scope,
                           max_attempts=1, **kwargs)


def refused(call, *args) -> str:
    with pytest.raises(ArtifactError) as info:
        call(*args)
    message = str(info.value)
    assert not any(secret in message or secret in repr(info.value) for secret in KEYS.values())
    return message


def put(path: Path, data: bytes = b"state") -> Path:
    path.write_bytes(data)
    return path


def test_the_training_key_writes_its_runs_checkpoints_and_nowhere_else(server, tmp_path):
    pod = store(server, "AKTRAINING", TRAINING, multipart_threshold_bytes=5 * 2**20, multipart_chunk_bytes=5 * 2**20)
    mine = f"models/{MODEL}/checkpoints/run-1/step-40.pt"
    assert pod.put_file(put(tmp_path / "a"), mine) == f"s3://{BUCKET}/{PREFIX}/{mine}"
    assert pod.exists(mine) and pod.list_keys(f"models/{MODEL}/checkpoints/run-1/") == [mine]

    other = f"models/{MODEL}/checkpoints/run-2/step-40.pt"
    assert refused(pod.put_file, put(tmp_path / "b"), other) == (
        f"access denied: key AKTRAINING may not write s3://{BUCKET}/{PREFIX}/{other} (the server answered "
        f"AccessDenied, HTTP 403); the training key may write only under "
        f"s3://{BUCKET}/{PREFIX}/models/{MODEL}/checkpoints/run-1/")
    # A multipart upload is refused the same way, before any part is stored.
    big = put(tmp_path / "big", b"x" * (6 * 2**20))
    assert "may not write" in refused(pod.put_file, big, f"models/{MODEL}/checkpoints/run-10/big.bin")
    # Another run's published weights can be neither overwritten nor deleted (a delete looks the
    # key up first, which the training key may not even read).
    published = f"models/{MODEL}/checkpoints/run-0/model.safetensors"
    assert "may not write" in refused(pod.put_file, put(tmp_path / "w"), published)
    assert "may not read" in refused(pod.delete, published)
    shards_store = store(server, "AKTRAINING", TRAINING, prefix=SHARDS.removeprefix(f"{BUCKET}/").rstrip("/"))
    assert "may not write" in refused(shards_store.put_file, put(tmp_path / "c"), "shards/train/00000.bin")
    admin = server.client()
    assert admin.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{published}")["Body"].read() == b"w0"
    assert admin.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/models/{MODEL}/checkpoints/run-2/").get("KeyCount") == 0
    assert admin.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/models/{MODEL}/checkpoints/run-10/").get("KeyCount") == 0


def as_pod(monkeypatch, key: str) -> None:
    """The environment a training pod gets from its key's Secret. boto3's default session caches
    the credentials it first found, so it starts afresh, as a new pod process would."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS[key])


def test_the_training_key_reads_the_shards_through_the_runtimes_reader_and_nothing_published(
        server, shards, tmp_path, monkeypatch):
    manifest, locations = shards
    as_pod(monkeypatch, "AKTRAINING")
    paths = resolve_shards(manifest, locations, "train", str(tmp_path / "cache"), server.endpoint_url)
    assert len(paths) == len(manifest["splits"]["train"]["shards"]) == 2
    # The weights another run published are outside the training key's grants.
    pod = store(server, "AKTRAINING", TRAINING)
    message = refused(pod.get_file, f"models/{MODEL}/checkpoints/run-0/model.safetensors", tmp_path / "w")
    assert message.startswith("access denied: key AKTRAINING may not read ")
    assert message.endswith(f"the training key may read only under s3://{SHARDS}, "
                            f"s3://{BUCKET}/{PREFIX}/models/{MODEL}/checkpoints/run-1/")
    # A pod holding the key with no grant cannot read the shards at all.
    as_pod(monkeypatch, "AKNOGRANT")
    with pytest.raises(DataError, match="cannot download shard s3://"):
        resolve_shards(manifest, locations, "train", str(tmp_path / "cache2"), server.endpoint_url)


def test_the_orchestrator_key_writes_what_it_publishes_and_not_the_shards(server, tmp_path):
    orchestrator = store(server, "AKORCHESTRATOR", ORCHESTRATOR)
    published = [f"models/{MODEL}/checkpoints/run-3/model.safetensors",
                 f"models/{MODEL}/checkpoints/run-3/tensorboard/events.out", f"models/{MODEL}/logs/run-3/rank0.log"]
    for key in published:
        orchestrator.put_file(put(tmp_path / "f"), key)
    assert set(published) <= set(orchestrator.list_keys("models/"))
    orchestrator.delete(published[0])  # housekeeping deletes under the artifact prefix
    assert not orchestrator.exists(published[0])
    shards_store = store(server, "AKORCHESTRATOR", ORCHESTRATOR, prefix=SHARDS.removeprefix(f"{BUCKET}/").rstrip("/"))
    assert refused(shards_store.put_file, put(tmp_path / "g"), "shards/train/00000.bin").endswith(
        f"the orchestrator key may write only under s3://{BUCKET}/{PREFIX}/")


def test_a_key_with_no_grant_is_refused_everything_and_an_unknown_key_is_named(server, tmp_path):
    nobody = store(server, "AKNOGRANT")
    key = f"models/{MODEL}/checkpoints/run-1/step-40.pt"
    for permission, call, args in (("write", nobody.put_file, (put(tmp_path / "h"), key)),
                                   ("read", nobody.get_file, (key, tmp_path / "out")),
                                   ("read", nobody.exists, (key,)),
                                   ("list", nobody.list_keys, ("models/",))):
        message = refused(call, *args)
        assert message.startswith(f"access denied: key AKNOGRANT may not {permission} s3://{BUCKET}/{PREFIX}/"), message
        assert f"grant this key {permission} on that prefix" in message
    unknown = store(server, "AKUNKNOWN")  # a PUT's error body names the code (a HEAD's, and a download's, has none)
    assert "InvalidAccessKeyId (the server knows no access key AKUNKNOWN" in refused(
        unknown.put_file, put(tmp_path / "i"), key)
