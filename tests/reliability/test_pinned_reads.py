"""Training reads shards at the commit the shards asset recorded, never at a moving branch head:
main is moved to different shard contents between the shards asset and training, and the run
still trains on, and records, the old commit (through lakeFS's S3 gateway, checksums verified)."""

from __future__ import annotations

import pytest

from core.registry import read_lineage
from tests.reliability.platforms import definitions, lakefs_store_resource, run_train, s3_credentials_in_env
from tests.support.lakefs_server import LakeFSTestServer

pytestmark = pytest.mark.slow
SECRET = "pinned-reads-secret"


def test_training_reads_the_pinned_commit_while_main_moves(tmp_path, monkeypatch, ledger):
    with LakeFSTestServer(tmp_path / "lakefs", access_key_id="AKIAPINNED", secret_access_key=SECRET) as server:
        s3_credentials_in_env(monkeypatch, server.access_key_id, SECRET)
        store_resource = lakefs_store_resource(server, SECRET)
        defs = definitions(tmp_path / "platform", store_resource)
        home = tmp_path / "home"
        first, errors, _ = run_train(defs, home, stages=["raw_dataset", "shards"])
        assert first.success, errors
        shards_commit = next(e.materialization.tags["dagster/data_version"]
                             for e in first.get_asset_materialization_events() if e.asset_key.path[-1] == "shards")
        store = store_resource.get()
        shard_paths = [o.path for o in store.list_objects(shards_commit, prefix="datasets/digits/shards/")
                       if o.path.endswith(".bin")]
        # Someone publishes different shard bytes to main (same paths, same sizes).
        store.create_branch("overwrite", "main")
        for path in shard_paths:
            size = len(store.get_object(shards_commit, path))
            store.put_object("overwrite", path, b"\xff" * size)
        store.commit("overwrite", "Overwrite shards", {})
        moved = store.merge("overwrite", "main", "Publish other shards")
        second, errors, _ = run_train(defs, home, stages=["checkpoint", "model_version"])
        record = read_lineage(store, "digits") if second.success else {}
        ok = second.success and record["data"]["shards_commit"] == shards_commit != moved
        ledger.record("consistency: training reads the pinned commit while main moves", ok, second.success,
                      "main overwritten with other shard bytes between the shards asset and training")
        assert second.success, errors
        assert record["data"]["shards_commit"] == shards_commit
        assert store.resolve_ref(shards_commit) == shards_commit != moved
