"""Two runs publishing at once, as separate processes, on every backend with a shared server."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.store.base import MAIN, VersionedStore
from resources.store.lakefs import LakeFSVersionedStore
from tests.support.store_workers import run_writers_at_once


@pytest.fixture(params=["local", "lakefs", "real-lakefs"])
def shared_store(request: pytest.FixtureRequest) -> tuple[VersionedStore, str, dict]:
    """A store plus the factory kind and settings another process uses to open the same one."""
    store = request.getfixturevalue(f"{request.param.replace('-', '_')}_store")
    if isinstance(store, LakeFSVersionedStore):
        key_id, secret = store._test_gateway_credentials
        endpoint = request.getfixturevalue("lakefs_server").direct_endpoint if request.param == "lakefs" \
            else store.endpoint
        settings = {"endpoint": endpoint, "access_key_id": key_id, "secret_access_key": secret,
                    "repository": store.repository}
        return store, "lakefs", settings
    return store, "local", {"root": str(store.root), "repository": store.repository}


def test_two_runs_publishing_disjoint_paths_both_land_on_main(shared_store, tmp_path: Path):
    store, kind, settings = shared_store
    writers = {f"run-{w}": {f"run-{w}/part-{i}.txt": f"{w}:{i}" for i in range(8)} for w in "ab"}
    results = run_writers_at_once(store, kind, settings, tmp_path, writers)
    assert {r["status"] for r in results.values()} == {"merged"}
    on_main = {o.path: store.get_object(MAIN, o.path).decode() for o in store.list_objects(MAIN)}
    assert on_main == {**writers["run-a"], **writers["run-b"]}
    assert store.resolve_ref(MAIN) in {r["head"] for r in results.values()}


def test_two_runs_writing_the_same_paths_one_wins_whole_the_other_fails_cleanly(shared_store, tmp_path: Path):
    store, kind, settings = shared_store
    paths = [f"shared/part-{i}.txt" for i in range(8)]
    writers = {f"run-{w}": {p: w for p in paths} for w in "ab"}
    results = run_writers_at_once(store, kind, settings, tmp_path, writers)
    assert sorted(r["status"] for r in results.values()) == ["conflict", "merged"]
    [winner] = [b for b, r in results.items() if r["status"] == "merged"]
    [loser] = [b for b, r in results.items() if r["status"] == "conflict"]
    assert sorted(results[loser]["paths"]) == sorted(paths)
    # main holds exactly the winner's data: never a mixture, never partial.
    on_main = {o.path: store.get_object(MAIN, o.path).decode() for o in store.list_objects(MAIN)}
    assert on_main == writers[winner]
    assert store.resolve_ref(MAIN) == results[winner]["head"]
    # The loser's branch is left for inspection with its complete commit.
    assert {o.path for o in store.list_objects(loser)} == set(paths)
