"""Artifact store backends for the behaviour suite: local disk and S3 on a real SeaweedFS."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest

from resources.artifacts.local import LocalArtifactStore
from resources.artifacts.s3 import S3ArtifactStore
from tests.support.fault_proxy import FaultProxy
from tests.support.seaweed import SeaweedServer


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    """One SeaweedFS for the session (it takes seconds to start); stopped at the end."""
    with SeaweedServer(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


_SESSION: list[boto3.Session] = []


def _s3_store(seaweed: SeaweedServer, endpoint_url: str | None = None, **kwargs) -> S3ArtifactStore:
    """A store on the session's bucket under a prefix of its own, so tests never share keys."""
    if not _SESSION:
        _SESSION.append(boto3.Session())  # building a session loads botocore's data: once is enough
    kwargs.setdefault("session", _SESSION[0])
    return S3ArtifactStore(
        bucket=seaweed.bucket, prefix=f"tests/{uuid.uuid4().hex[:12]}",
        endpoint_url=endpoint_url or seaweed.endpoint_url,
        region="us-east-1", access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key, **kwargs,
    )


@pytest.fixture
def make_s3_store():
    """``make_s3_store(seaweed, endpoint_url=None, **S3ArtifactStore settings)``."""
    return _s3_store


@pytest.fixture(params=["local", "s3"])
def artifact_store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "local":
        return LocalArtifactStore(tmp_path / "artifacts")
    seaweed = request.getfixturevalue("seaweed")
    # Small multipart settings so the suite's "large" file really goes up in parts.
    return _s3_store(seaweed, multipart_threshold_bytes=5 * 1024 * 1024, multipart_chunk_bytes=5 * 1024 * 1024)


@pytest.fixture
def s3_fault_proxy(seaweed: SeaweedServer):
    with FaultProxy(seaweed.endpoint_url, stall_s=10) as proxy:
        yield proxy
