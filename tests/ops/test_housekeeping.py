"""Run-branch cleanup removes old branches but never one a lineage record points to."""

import json

from core.registry import lineage_path, version_tag
from ops.housekeeping import stale_run_branches
from resources.store.local import LocalVersionedStore


def _store(tmp_path):
    s = LocalVersionedStore(tmp_path, "repo")
    s.ensure_repository()
    return s


def _run_branch(store, run: str, content: bytes) -> str:
    name = f"run-{run}"
    store.create_branch(name, "main")
    store.put_object(name, f"datasets/x/{run}.bin", content)
    return store.commit(name, f"write {run}", {"dagster_run_id": run}).id


def test_old_branches_go_recent_and_non_run_branches_stay(tmp_path):
    s = _store(tmp_path)
    _run_branch(s, "old", b"a")
    s.create_branch("feature", "main")
    now_far = s.get_commit("run-old").creation_date + 10 * 3600
    assert stale_run_branches(s, older_than_s=3600, now=now_far) == ["run-old"]
    assert stale_run_branches(s, older_than_s=100 * 3600, now=now_far) == []


def test_branch_holding_a_lineage_commit_is_kept(tmp_path):
    s = _store(tmp_path)
    kept_commit = _run_branch(s, "kept", b"k")
    _run_branch(s, "gone", b"g")
    record = {"data": {"raw_commit": kept_commit, "shards_commit": kept_commit},
              "checkpoint": {"commit": kept_commit}}
    s.create_branch("publish", "main")
    s.put_object("publish", lineage_path("m", 1), json.dumps(record).encode())
    tagged = s.commit("publish", "register m v1", {}).id
    s.create_tag(version_tag("m", 1), tagged)
    later = s.get_commit("run-gone").creation_date + 10 * 3600
    assert stale_run_branches(s, older_than_s=3600, now=later) == ["run-gone"]

