"""One behaviour suite for every ArtifactStore backend."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from resources.artifacts.base import ArtifactError, ArtifactStore


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_put_then_get_round_trips_and_returns_the_uri(artifact_store: ArtifactStore, tmp_path: Path):
    src = write(tmp_path / "in" / "model.pt", b"weights")
    uri = artifact_store.put_file(src, "digits/v1/model.pt")
    assert uri == artifact_store.uri("digits/v1/model.pt")
    assert uri.startswith(("file:///", "s3://"))
    assert uri.endswith("/digits/v1/model.pt")
    dest = artifact_store.get_file("digits/v1/model.pt", tmp_path / "out" / "model.pt")
    assert dest.read_bytes() == b"weights"


def test_large_file_round_trips_intact(artifact_store: ArtifactStore, tmp_path: Path):
    data = os.urandom(12 * 1024 * 1024 + 123)  # above the S3 multipart threshold used here
    src = write(tmp_path / "big.bin", data)
    artifact_store.put_file(src, "ckpt/big.bin")
    out = artifact_store.get_file("ckpt/big.bin", tmp_path / "big.out")
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_overwrite_replaces_the_whole_object(artifact_store: ArtifactStore, tmp_path: Path):
    artifact_store.put_file(write(tmp_path / "a", b"first version, longer"), "k")
    artifact_store.put_file(write(tmp_path / "b", b"second"), "k")
    assert artifact_store.get_file("k", tmp_path / "out").read_bytes() == b"second"


def test_exists_list_and_delete(artifact_store: ArtifactStore, tmp_path: Path):
    src = write(tmp_path / "f", b"x")
    for key in ("run-1/a.pt", "run-1/sub/b.pt", "run-2/c.pt"):
        artifact_store.put_file(src, key)
    assert artifact_store.exists("run-1/a.pt")
    assert not artifact_store.exists("run-1/missing.pt")
    assert artifact_store.list_keys() == ["run-1/a.pt", "run-1/sub/b.pt", "run-2/c.pt"]
    assert artifact_store.list_keys("run-1/") == ["run-1/a.pt", "run-1/sub/b.pt"]
    assert artifact_store.list_keys("nothing/") == []
    artifact_store.delete("run-1/a.pt")
    assert not artifact_store.exists("run-1/a.pt")
    with pytest.raises(ArtifactError, match="not found"):
        artifact_store.delete("run-1/a.pt")


def test_get_of_a_missing_key_says_not_found_and_leaves_no_file(artifact_store: ArtifactStore, tmp_path: Path):
    dest = tmp_path / "out" / "missing.pt"
    with pytest.raises(ArtifactError, match="not found"):
        artifact_store.get_file("missing.pt", dest)
    assert not dest.exists()
    leftovers = list(dest.parent.iterdir()) if dest.parent.exists() else []
    assert leftovers == []


def test_upload_of_a_missing_local_file_is_refused(artifact_store: ArtifactStore, tmp_path: Path):
    with pytest.raises(ArtifactError, match="not a readable file"):
        artifact_store.put_file(tmp_path / "nope.pt", "k")


@pytest.mark.parametrize("key", ["", "/abs", "../escape", "a/../b", "a//b", "./a", "a\\b", "ctl\x00"])
def test_invalid_keys_are_refused(artifact_store: ArtifactStore, tmp_path: Path, key: str):
    src = write(tmp_path / "f", b"x")
    with pytest.raises(ArtifactError, match="invalid artifact key"):
        artifact_store.put_file(src, key)
    with pytest.raises(ArtifactError, match="invalid artifact key"):
        artifact_store.exists(key)
    assert artifact_store.list_keys() == []


def test_local_keys_that_collide_with_existing_artifacts_are_refused(tmp_path: Path):
    from resources.artifacts.local import LocalArtifactStore

    store = LocalArtifactStore(tmp_path / "artifacts")
    src = write(tmp_path / "f", b"x")
    store.put_file(src, "a/b")
    with pytest.raises(ArtifactError, match="a parent of it is already an artifact"):
        store.put_file(src, "a/b/c")
    with pytest.raises(ArtifactError, match="directory of artifacts"):
        store.put_file(src, "a")
    assert store.list_keys() == ["a/b"]
