"""Backends the store behaviour suite runs against: every test gets a fresh repository.

``local`` and ``lakefs`` (the lakeFS-API test server over real HTTP) always run. ``real-lakefs``
runs when a lakeFS is reachable, e.g. the quickstart container:

    docker run --pull always -p 8000:8000 treeverse/lakefs:latest run --quickstart
    export LAKEFS_ENDPOINT=http://127.0.0.1:8000
    export LAKEFS_ACCESS_KEY_ID=AKIAIOSFOLQUICKSTART
    export LAKEFS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY
    # optional, default local:// (the quickstart's local blockstore)
    export LAKEFS_STORAGE_NAMESPACE_PREFIX=local://

Each test creates its own repository there and deletes it afterwards. The same settings point
lakeFS's own wrapper tests (tests/store/lakefs_conformance) at that lakeFS instead of the test
server.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resources.store.lakefs import LakeFSVersionedStore
from resources.store.local import LocalVersionedStore
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.store_backends import fresh_repository_name, make_lakefs_store

REAL_LAKEFS_ENV = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY")


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
        pytest.skip(f"no real lakeFS: set {', '.join(missing)} (lakeFS quickstart: see tests/store/conftest.py) to run against one")
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
