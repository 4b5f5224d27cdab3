"""Backends the store behaviour suite runs against: every test gets a fresh repository."""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

import pytest

from resources.store.local import LocalVersionedStore

REAL_LAKEFS_ENV = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY")
_counter = itertools.count()


def fresh_repository_name() -> str:
    # Unique per test so a shared real lakeFS never sees a repository twice.
    return f"test-{uuid.uuid4().hex[:10]}-{next(_counter)}"


@pytest.fixture
def local_store(tmp_path: Path) -> LocalVersionedStore:
    store = LocalVersionedStore(tmp_path / "store", fresh_repository_name())
    store.ensure_repository()
    return store


@pytest.fixture(params=["local"])
def store(request: pytest.FixtureRequest):
    """Every VersionedStore backend, each with a fresh repository."""
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_store")


@pytest.fixture
def store_credentials(store) -> tuple[str, str] | None:
    """Credentials a worker would use to read s3:// pinned locations (None for local files)."""
    return getattr(store, "_test_gateway_credentials", None)
