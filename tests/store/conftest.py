"""Backends the store behaviour suite runs against: every test gets a fresh repository."""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

import pytest

from resources.store.lakefs import LakeFSVersionedStore
from resources.store.local import LocalVersionedStore
from tests.support.lakefs_server import LakeFSTestServer

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


@pytest.fixture(scope="session")
def lakefs_server(tmp_path_factory: pytest.TempPathFactory):
    """The lakeFS-API test server (behind its fault proxy) for the whole session."""
    with LakeFSTestServer(tmp_path_factory.mktemp("lakefs-server"), stall_s=10) as server:
        yield server


def make_lakefs_store(server: LakeFSTestServer, repository: str | None = None, **kwargs) -> LakeFSVersionedStore:
    name = repository or fresh_repository_name()
    settings = {"max_attempts": 3, "backoff_s": 0.05, "read_timeout_s": 5, **kwargs}
    store = LakeFSVersionedStore(
        endpoint=server.endpoint, access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key, repository=name,
        storage_namespace=f"local://{name}", **settings,
    )
    store._test_gateway_credentials = (server.access_key_id, server.secret_access_key)
    return store


@pytest.fixture
def lakefs_store(lakefs_server: LakeFSTestServer) -> LakeFSVersionedStore:
    lakefs_server.proxy.clear()
    store = make_lakefs_store(lakefs_server)
    store.ensure_repository()
    return store


@pytest.fixture
def real_lakefs_store():
    missing = [name for name in REAL_LAKEFS_ENV if not os.environ.get(name)]
    if missing:
        pytest.skip(f"no real lakeFS: set {', '.join(missing)} (see README, lakeFS quickstart) to run against one")
    name = fresh_repository_name()
    prefix = os.environ.get("LAKEFS_STORAGE_NAMESPACE_PREFIX", "local://")
    store = LakeFSVersionedStore(
        endpoint=os.environ["LAKEFS_ENDPOINT"], access_key_id=os.environ["LAKEFS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["LAKEFS_SECRET_ACCESS_KEY"], repository=name,
        storage_namespace=prefix + name if prefix.endswith("/") else f"{prefix}/{name}",
    )
    store._test_gateway_credentials = (os.environ["LAKEFS_ACCESS_KEY_ID"], os.environ["LAKEFS_SECRET_ACCESS_KEY"])
    store.ensure_repository()
    yield store
    store.delete_repository()


@pytest.fixture(params=["local", "lakefs", "real-lakefs"])
def store(request: pytest.FixtureRequest):
    """Every VersionedStore backend, each with a fresh repository."""
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_store")


@pytest.fixture
def store_credentials(store) -> tuple[str, str] | None:
    """Credentials a worker would use to read s3:// pinned locations (None for local files)."""
    return getattr(store, "_test_gateway_credentials", None)
