"""Building stores for tests: fresh repository names and lakeFS stores on the test server."""

from __future__ import annotations

import itertools
import uuid

from resources.store.lakefs import LakeFSVersionedStore
from tests.support.lakefs_server import LakeFSTestServer

_counter = itertools.count()


def fresh_repository_name() -> str:
    # Unique per test so a shared (real) lakeFS never sees a repository twice.
    return f"test-{uuid.uuid4().hex[:10]}-{next(_counter)}"


def make_lakefs_store(server: LakeFSTestServer, repository: str | None = None, **kwargs) -> LakeFSVersionedStore:
    """A store on the test server, through its fault proxy, with fast retries for tests."""
    name = repository or fresh_repository_name()
    settings = {"max_attempts": 3, "backoff_s": 0.05, "read_timeout_s": 5, **kwargs}
    store = LakeFSVersionedStore(
        endpoint=server.endpoint, access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key, repository=name,
        storage_namespace=f"local://{name}", **settings,
    )
    # What a worker reading s3:// pinned locations through the gateway would be given.
    store._test_gateway_credentials = (server.access_key_id, server.secret_access_key)
    return store
