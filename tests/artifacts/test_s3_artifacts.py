"""S3-only promises: multipart uploads, bounded retries on transient faults, no leaked secrets."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from resources.artifacts.base import ArtifactError
from resources.artifacts.factory import make_artifact_store
from resources.artifacts.local import LocalArtifactStore
from resources.artifacts.s3 import S3ArtifactStore

PLANTED_SECRET = "planted-SECRET-value-0123456789"


def test_large_files_go_up_in_parts(seaweed, make_s3_store, tmp_path: Path):
    store = make_s3_store(seaweed, multipart_threshold_bytes=5 * 1024 * 1024, multipart_chunk_bytes=5 * 1024 * 1024)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * 1024 * 1024))
    store.put_file(src, "big.bin")
    head = seaweed.client().head_object(Bucket=seaweed.bucket, Key=f"{store.prefix}/big.bin")
    # A multipart ETag is "<md5 of part md5s>-<parts>": 11 MiB in 5 MiB parts is 3 parts.
    assert head["ETag"].strip('"').endswith("-3")
    assert head["ContentLength"] == 11 * 1024 * 1024


@pytest.mark.parametrize("fault", ["503", "500", "reset", "stall"])
def test_transient_faults_are_retried_until_the_server_recovers(seaweed, make_s3_store, s3_fault_proxy, tmp_path: Path, fault):
    store = make_s3_store(seaweed, endpoint_url=s3_fault_proxy.url, max_attempts=4, read_timeout_s=1)
    src = tmp_path / "f.bin"
    src.write_bytes(b"payload")
    s3_fault_proxy.inject(fault, 2)
    store.put_file(src, "k.bin")
    assert s3_fault_proxy.faults_served == [fault, fault]
    s3_fault_proxy.inject(fault, 2)
    assert store.get_file("k.bin", tmp_path / "out.bin").read_bytes() == b"payload"
    s3_fault_proxy.inject(fault, 1)
    assert store.list_keys() == ["k.bin"]


@pytest.mark.parametrize("fault", ["503", "reset", "stall"])
def test_persistent_faults_stop_after_the_bounded_attempts_with_a_clear_error(seaweed, make_s3_store, s3_fault_proxy, fault):
    store = make_s3_store(seaweed, endpoint_url=s3_fault_proxy.url, max_attempts=3, read_timeout_s=1)
    s3_fault_proxy.inject(fault, 100)
    with pytest.raises(ArtifactError, match="after 3 attempts") as info:
        store.exists("anything.bin")
    assert s3_fault_proxy.requests_seen == 3
    assert "s3://" in str(info.value)
    s3_fault_proxy.clear()
    assert store.exists("anything.bin") is False


def test_unreachable_endpoint_names_the_endpoint(tmp_path: Path):
    from tests.support.ports import free_ports

    [port] = free_ports(1)
    store = S3ArtifactStore("bucket-x", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1",
                            access_key_id="k", secret_access_key=PLANTED_SECRET, max_attempts=2, connect_timeout_s=1)
    with pytest.raises(ArtifactError, match=f"127.0.0.1:{port}.*reachable"):
        store.list_keys()


def test_missing_bucket_names_the_bucket_and_ensure_bucket_creates_it(seaweed, tmp_path: Path):
    store = S3ArtifactStore("no-such-bucket-here", endpoint_url=seaweed.endpoint_url, region="us-east-1",
                            access_key_id="k", secret_access_key="s", max_attempts=1)
    src = tmp_path / "f"
    src.write_bytes(b"x")
    with pytest.raises(ArtifactError, match="no-such-bucket-here.*(NoSuchBucket|AccessDenied)"):
        store.put_file(src, "k")
    store.ensure_bucket()
    store.put_file(src, "k")
    assert store.exists("k")


def test_secret_never_appears_in_repr_errors_or_logs(seaweed, s3_fault_proxy, caplog, tmp_path: Path):
    caplog.set_level(logging.DEBUG)
    store = S3ArtifactStore(seaweed.bucket, prefix="secret-test", endpoint_url=s3_fault_proxy.url,
                            region="us-east-1", access_key_id="AKIAPLANTED", secret_access_key=PLANTED_SECRET,
                            max_attempts=2, read_timeout_s=1)
    texts = [repr(store), str(store)]
    s3_fault_proxy.inject("503", 10)
    with pytest.raises(ArtifactError) as info:
        store.get_file("k", tmp_path / "out")
    texts += [str(info.value), repr(info.value)]
    s3_fault_proxy.clear()
    with pytest.raises(ArtifactError) as info:
        store.get_file("missing", tmp_path / "out")
    texts += [str(info.value), repr(info.value), caplog.text]
    assert all(PLANTED_SECRET not in t for t in texts)


def test_factory_builds_both_kinds_and_refuses_bad_settings(seaweed, tmp_path: Path):
    assert isinstance(make_artifact_store("local", root=tmp_path), LocalArtifactStore)
    s3 = make_artifact_store("s3", bucket=seaweed.bucket, endpoint_url=seaweed.endpoint_url, region="us-east-1",
                             access_key_id="k", secret_access_key="s")
    assert isinstance(s3, S3ArtifactStore)
    with pytest.raises(ArtifactError, match="bucket"):
        make_artifact_store("s3", endpoint_url="http://x")
    with pytest.raises(ArtifactError, match="bad settings"):
        make_artifact_store("s3", bucket="b", colour="blue")
    with pytest.raises(ArtifactError, match="both access_key_id and secret_access_key"):
        make_artifact_store("s3", bucket="b", access_key_id="only-id")
    with pytest.raises(ArtifactError, match="unknown artifact store kind"):
        make_artifact_store("gcs", bucket="b")
    with pytest.raises(ArtifactError, match="root"):
        make_artifact_store("local")
