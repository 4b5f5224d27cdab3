"""Store housekeeping: the plan lists exactly what is stale, with reasons; applying it deletes
that and nothing a registered version's lineage or an in-flight run uses."""

import getpass
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from core.audit import HOUSEKEEPING_LOG, list_housekeeping
from core.housekeeping import (
    ARTIFACT,
    CHECKPOINT_DIR,
    REPRODUCTION,
    RUN_BRANCH,
    HousekeepingError,
    InUse,
    apply_plan,
    format_plan,
    plan_housekeeping,
    stale_run_branches,
)
from core.identity import AUTH_PROXY, OS_USER, Actor, describe_entry, launch_identity_tags
from core.lineage import commit_ids
from core.registry import lineage_path, read_lineage, version_tag
from core.versions import register_version
from ops.housekeeping import housekeeping_definitions, store_housekeeping
from resources.artifacts.local import LocalArtifactStore
from resources.platform import ArtifactStoreResource, PlatformSettings, VersionedStoreResource
from resources.store.base import MAIN
from resources.store.factory import make_store
from resources.store.local import LocalVersionedStore
from tests.cli.records import make_record

DAY = 86_400.0
OLDER_THAN_DAYS = 7


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


# --- a store with a registered version and stale things around it --------------------------------

@dataclass
class World:
    store: object
    artifacts: LocalArtifactStore
    data_root: Path
    in_use: InUse
    registered_key: str
    checkpoint_commit: str
    weights: bytes

    @property
    def checkpoints(self) -> Path:
        return self.data_root / "checkpoints"

    @property
    def reproductions(self) -> Path:
        return self.data_root / "reproductions"

    def plan(self, **kwargs):
        return plan_housekeeping(self.store, self.artifacts, self.checkpoints, self.reproductions,
                                 older_than_days=OLDER_THAN_DAYS, in_use=self.in_use, **kwargs)


def _at(patch: pytest.MonkeyPatch, when: float) -> None:
    """Commits the local store makes from now on carry ``when`` as their date."""
    patch.setattr("resources.store.local.time", SimpleNamespace(time=lambda: when))


def _age_tree(path: Path, when: float) -> None:
    for p in [path, *path.rglob("*")]:
        os.utime(p, (when, when))


def _work_dir(root: Path, model: str, run: str, weights: bytes, when: float) -> Path:
    d = root / model / run
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "step-40.pt").write_bytes(b"state " + weights)
    (d / "output").mkdir()
    (d / "output" / "model.safetensors").write_bytes(weights)
    _age_tree(d, when)
    return d


def _commit_checkpoint(store, artifacts, tmp: Path, run: str, weights: bytes) -> tuple[str, str, str]:
    """What the training op does: weights to the artifact store and to the run branch, committed."""
    key = f"models/toy/checkpoints/{run}/model.safetensors"
    local = tmp / f"{run}-model.safetensors"
    local.write_bytes(weights)
    uri = artifacts.put_file(local, key)
    store.put_file(f"run-{run}", key, local)
    return key, uri, store.commit(f"run-{run}", "Train toy", {"dagster_run_id": run}).id


def build_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    with monkeypatch.context() as clock:
        return _build_world(tmp_path, clock)


def _build_world(tmp_path: Path, clock: pytest.MonkeyPatch) -> World:
    old, recent = time.time() - 10 * DAY, time.time() - DAY
    store = make_store("local", root=tmp_path / "store", repository="model-factory")
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    data_root = tmp_path / "platform"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    _at(clock, old)
    store.ensure_repository()

    # A data run: its raw and shards commits stay on its (unmerged) branch; a version uses them.
    store.create_branch("run-data1", MAIN)
    store.put_object("run-data1", "datasets/toy/raw/data.parquet", b"raw")
    raw_commit = store.commit("run-data1", "Ingest raw data of toy", {}).id
    store.put_object("run-data1", "datasets/toy/shards/manifest.json", b"{}")
    shards_commit = store.commit("run-data1", "Shard toy", {}).id

    # A training run that registered toy v1 (register_version merges its branch into main).
    weights = b"registered weights"
    store.create_branch("run-train1", MAIN)
    key, uri, checkpoint_commit = _commit_checkpoint(store, artifacts, scratch, "train1", weights)
    record = make_record(1, **{"checkpoint.uri": uri, "checkpoint.store_path": key,
                               "checkpoint.sha256": hashlib.sha256(weights).hexdigest(),
                               "checkpoint.commit": checkpoint_commit, "data.raw_commit": raw_commit,
                               "data.shards_commit": shards_commit, "dagster.run_id": "train1"})
    register_version(store, "run-train1", "toy", lambda v: {**record, "version": v}, {"model.safetensors": weights}, {})
    _work_dir(data_root / "checkpoints", "toy", "train1", weights, old)
    # A retry registers under its own run id but trains in its root run's dir: same weights.
    _work_dir(data_root / "checkpoints", "toy", "root0", weights, old)

    # A run that failed its quality gate: branch, artifact and work dir are orphaned.
    store.create_branch("run-failed", MAIN)
    _commit_checkpoint(store, artifacts, scratch, "failed", b"failed weights")
    store.put_object("run-failed", "models/toy/candidates/failed/evaluation.json", b"{}")
    store.commit("run-failed", "Candidate toy failed its quality gate", {})
    _work_dir(data_root / "checkpoints", "toy", "failed", b"failed weights", old)

    # A run that stopped before committing anything: its branch is main's old head.
    store.create_branch("run-empty", MAIN)

    # A retry in flight: a fresh branch at main's old head, resuming in its root run's dir.
    store.create_branch("run-live", MAIN)
    (scratch / "live.pt").write_bytes(b"live")
    artifacts.put_file(scratch / "live.pt", "models/toy/checkpoints/live/model.safetensors")
    _work_dir(data_root / "checkpoints", "toy", "live-root", b"live", old)

    # Shards that only the latest materialization of an asset points at.
    store.create_branch("run-shards2", MAIN)
    store.put_object("run-shards2", "datasets/toy/shards/manifest.json", b"{\"v\": 2}")
    materialized = store.commit("run-shards2", "Shard toy", {}).id

    # A checkpoint whose run branch was removed by hand: its age is unknown.
    (scratch / "ghost.pt").write_bytes(b"ghost")
    artifacts.put_file(scratch / "ghost.pt", "models/toy/checkpoints/ghost/model.safetensors")
    # Not a checkpoint: housekeeping leaves other artifact keys alone.
    artifacts.put_file(scratch / "ghost.pt", "exports/toy/model.onnx")

    store.create_branch("feature", MAIN)
    store.put_object("feature", "notes.md", b"wip")
    store.commit("feature", "wip", {})

    # A recent failed run and a recent reproduction: too young to go.
    _at(clock, recent)
    store.create_branch("run-recent", MAIN)
    _commit_checkpoint(store, artifacts, scratch, "recent", b"recent weights")
    _work_dir(data_root / "checkpoints", "toy", "recent", b"recent weights", recent)

    for name, when in (("toy-v1-20261101T000000Z", old), ("toy-v1-20261129T000000Z", recent)):
        d = data_root / "reproductions" / name
        (d / "output").mkdir(parents=True)
        (d / "reproduction.json").write_text("{}")
        _age_tree(d, when)

    in_use = InUse(run_ids=frozenset({"live", "live-root"}), commits=frozenset({materialized}))
    return World(store=store, artifacts=artifacts, data_root=data_root, in_use=in_use, registered_key=key,
                 checkpoint_commit=checkpoint_commit, weights=weights)


def _expected_deletions(w: World) -> set[tuple[str, str]]:
    return {
        (RUN_BRANCH, "run-train1"), (RUN_BRANCH, "run-empty"), (RUN_BRANCH, "run-failed"),
        (ARTIFACT, "models/toy/checkpoints/failed/model.safetensors"),
        (CHECKPOINT_DIR, str(w.checkpoints / "toy" / "failed")),
        (REPRODUCTION, str(w.reproductions / "toy-v1-20261101T000000Z")),
    }


def _assert_lineage_intact(w: World) -> None:
    record = read_lineage(w.store, "toy", 1)
    for name, commit in commit_ids(record).items():
        assert w.store.get_commit(commit).id == commit, name
    assert w.store.get_object(record["checkpoint"]["commit"], record["checkpoint"]["store_path"]) == w.weights
    assert w.store.get_object(version_tag("toy", 1), "models/toy/versions/v1/model.safetensors") == w.weights
    assert w.artifacts.exists(w.registered_key)
    assert w.artifacts.uri(w.registered_key) == record["checkpoint"]["uri"]
    assert (w.checkpoints / "toy" / "train1" / "output" / "model.safetensors").read_bytes() == w.weights
    assert (w.checkpoints / "toy" / "root0" / "output" / "model.safetensors").is_file()


def test_plan_lists_exactly_the_stale_things_with_reasons(tmp_path, monkeypatch):
    w = build_world(tmp_path, monkeypatch)
    plan = w.plan()
    assert {(d.kind, d.target) for d in plan.deletions} == _expected_deletions(w)
    reasons = {d.target: d.reason for d in plan.deletions}
    assert reasons["run-train1"].startswith("merged") and reasons["run-empty"].startswith("merged")
    assert reasons["run-failed"].startswith("not merged")
    assert "registered no version" in reasons["models/toy/checkpoints/failed/model.safetensors"]
    kept = {k.target: k.reason for k in plan.kept}
    assert kept == {
        "run-data1": kept["run-data1"], "run-live": "its run is still in flight",
        "run-shards2": "holds commit " + w.store.resolve_ref("run-shards2")[:12]
                       + ", not on main, used by the latest materialization of an asset",
        w.registered_key: "checkpoint of registered toy v1",
        "models/toy/checkpoints/live/model.safetensors": "its run live is still in flight",
        "models/toy/checkpoints/ghost/model.safetensors": "its run branch run-ghost is gone, so its age is unknown",
        str(w.checkpoints / "toy" / "train1"): "checkpoint dir of registered toy v1",
        str(w.checkpoints / "toy" / "root0"): "checkpoint dir of registered toy v1",
        str(w.checkpoints / "toy" / "live-root"): "its run live-root (or a retry of it) is still in flight",
    }
    assert kept["run-data1"].endswith("used by toy v1")
    assert plan.counts() == {RUN_BRANCH: 3, ARTIFACT: 1, CHECKPOINT_DIR: 1, REPRODUCTION: 1}
    # Planning deleted nothing.
    assert {"run-train1", "run-empty", "run-failed"} <= set(w.store.list_branches())
    assert (w.checkpoints / "toy" / "failed").is_dir()


def test_apply_deletes_the_plan_and_keeps_what_lineage_points_at(tmp_path, monkeypatch):
    w = build_world(tmp_path, monkeypatch)
    plan = w.plan()
    applied = apply_plan(plan, w.store, w.artifacts)
    assert applied.deleted == plan.deletions and applied.skipped == ()
    assert set(w.store.list_branches()) == {MAIN, "run-data1", "run-live", "run-shards2", "run-recent", "feature"}
    assert sorted(w.artifacts.list_keys()) == sorted([
        "exports/toy/model.onnx", "models/toy/checkpoints/ghost/model.safetensors",
        "models/toy/checkpoints/live/model.safetensors", "models/toy/checkpoints/recent/model.safetensors", w.registered_key])
    assert sorted(p.name for p in (w.checkpoints / "toy").iterdir()) == ["live-root", "recent", "root0", "train1"]
    assert [p.name for p in w.reproductions.iterdir()] == ["toy-v1-20261129T000000Z"]
    _assert_lineage_intact(w)
    assert w.plan().deletions == ()


def test_apply_skips_what_changed_since_planning(tmp_path, monkeypatch):
    w = build_world(tmp_path, monkeypatch)
    plan = w.plan()
    w.store.put_object("run-failed", "notes.md", b"someone is looking at this run")
    moved = w.store.commit("run-failed", "notes", {}).id
    (w.checkpoints / "toy" / "failed" / "checkpoints" / "step-80.pt").write_bytes(b"resumed")
    w.store.delete_branch("run-empty")
    applied = apply_plan(plan, w.store, w.artifacts)
    assert dict((i.target, why) for i, why in applied.skipped) == {
        "run-failed": f"its head moved to {moved[:12]} since planning",
        str(w.checkpoints / "toy" / "failed"): "written to since planning",
        "run-empty": "already gone",
    }
    assert "run-failed" in w.store.list_branches() and (w.checkpoints / "toy" / "failed").is_dir()
    assert len(applied.deleted) == len(plan.deletions) - 3


def test_a_failed_deletion_says_what_already_went(tmp_path, monkeypatch):
    w = build_world(tmp_path, monkeypatch)
    plan = w.plan()

    def refuse(key):
        raise OSError(f"permission denied: {key}")

    monkeypatch.setattr(w.artifacts, "delete", refuse)
    with pytest.raises(HousekeepingError, match="could not delete artifact") as info:
        apply_plan(plan, w.store, w.artifacts)
    assert {d.kind for d in info.value.deleted} == {RUN_BRANCH}


def test_format_plan_has_a_line_per_item_and_a_summary(tmp_path, monkeypatch):
    w = build_world(tmp_path, monkeypatch)
    plan = w.plan()
    lines = format_plan(plan).splitlines()
    assert len(lines) == len(plan.deletions) + len(plan.kept) + 1
    failed = next(line for line in lines if line.split()[2:3] == ["run-failed"])
    assert failed.split()[:2] == ["delete", RUN_BRANCH] and "not merged" in failed
    assert any(line.startswith("keep") and w.registered_key in line for line in lines)
    assert lines[-1] == ("6 to delete (3 run-branch, 1 artifact, 1 checkpoint-dir, 1 reproduction), "
                         "9 kept; older than 7 day(s)")


def test_a_plan_is_refused_when_a_lineage_record_lacks_what_protects_its_checkpoint(tmp_path):
    s = _store(tmp_path)
    _run_branch(s, "x", b"x")
    s.put_object(MAIN, lineage_path("m", 1), json.dumps(
        {"data": {"raw_commit": "a", "shards_commit": "b"}, "checkpoint": {"commit": "c"}}).encode())
    s.create_tag(version_tag("m", 1), s.commit(MAIN, "register m v1", {}).id)
    with pytest.raises(HousekeepingError, match="m v1 has no 'dagster'"):
        plan_housekeeping(s, LocalArtifactStore(tmp_path / "a"), tmp_path / "c", tmp_path / "r",
                          older_than_days=7, in_use=InUse())
    with pytest.raises(ValueError, match="positive"):
        plan_housekeeping(s, LocalArtifactStore(tmp_path / "a"), tmp_path / "c", tmp_path / "r",
                          older_than_days=0, in_use=InUse())


# --- through Dagster --------------------------------------------------------------------------------

def _resources(tmp_path: Path) -> dict:
    return {"store": VersionedStoreResource(kind="local", local_root=str(tmp_path / "store")),
            "artifacts": ArtifactStoreResource(kind="local", local_root=str(tmp_path / "artifacts")),
            "platform": PlatformSettings(data_root=str(tmp_path / "platform"))}


def _instance_knowing(w: World, instance: dg.DagsterInstance | None = None) -> dg.DagsterInstance:
    """An instance where the retry 'live' (root 'live-root') runs and run-shards2's commit is the
    latest materialization of the shards asset."""
    instance = instance or dg.DagsterInstance.ephemeral()
    instance.add_run(dg.DagsterRun(job_name="toy_training", run_id="live", status=dg.DagsterRunStatus.STARTED,
                                   tags={"dagster/root_run_id": "live-root", "dagster/parent_run_id": "live-root"}))
    instance.add_run(dg.DagsterRun(job_name="toy_training", run_id="failed", status=dg.DagsterRunStatus.FAILURE))
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=["toy", "shards"], tags={"dagster/data_version": w.store.resolve_ref("run-shards2")}))
    return instance


def _run(w: World, tmp_path: Path, instance, tags: dict | None = None, **config) -> tuple[dict, dict]:
    result = store_housekeeping.execute_in_process(
        resources=_resources(tmp_path), instance=instance, run_config={"ops": {"clean_store": {"config": config}}},
        tags=tags)
    assert result.success
    output = next(e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT")
    metadata = {k: v.value for k, v in output.event_specific_data.metadata.items()}
    return result.output_for_node("clean_store"), metadata


def test_the_job_plans_in_a_dry_run_and_deletes_when_applying(tmp_path, monkeypatch):
    w = build_world(tmp_path, monkeypatch)
    instance = _instance_knowing(w)
    branches = set(w.store.list_branches())

    summary, metadata = _run(w, tmp_path, instance, dry_run=True, older_than_days=OLDER_THAN_DAYS)
    assert summary == {"dry_run": True, "planned": {RUN_BRANCH: 3, ARTIFACT: 1, CHECKPOINT_DIR: 1, REPRODUCTION: 1},
                       "kept": 9, "deleted": 0, "skipped": 0}
    assert metadata["planned_run_branch"] == 3 and metadata["deleted"] == 0 and metadata["dry_run"] is True
    assert "run-failed" in metadata["plan"]
    assert set(w.store.list_branches()) == branches

    summary, metadata = _run(w, tmp_path, instance, dry_run=False)
    assert summary["deleted"] == 6 and metadata["deleted"] == 6
    assert set(w.store.list_branches()) == branches - {"run-train1", "run-empty", "run-failed"}
    assert not (w.checkpoints / "toy" / "failed").exists()
    assert (w.checkpoints / "toy" / "live-root").is_dir()
    _assert_lineage_intact(w)
    # The apply is in the audit trail: who (here the OS user, not authenticated), what and why.
    (record,) = list_housekeeping(w.store)
    assert (record["by"], record["actor"]["verified_by"], record["actor"]["authenticated"]) == (
        getpass.getuser(), OS_USER, False)
    assert {(d["kind"], d["target"]) for d in record["deleted"]} == _expected_deletions(w)
    assert metadata["audit_record"].startswith(HOUSEKEEPING_LOG) and metadata["audit_record"].endswith(
        f"-{record['id']}.json")
    assert metadata["applied_by"] == getpass.getuser() and record["dagster_run_id"]


def test_an_apply_launched_from_the_ui_records_the_proxys_user_only_where_the_coordinator_verifies(
        tmp_path, monkeypatch):
    from dagster._core.test_utils import instance_for_test

    from tests.core.launch_webserver import coordinator_config

    alice = Actor("alice@example.com", AUTH_PROXY, True, "X-Forwarded-Email set by the authenticating proxy")
    tags = launch_identity_tags(alice, "launch-1")
    # Locally nothing verifies launches: the same tags typed into the launchpad are not believed.
    for name in ("local", "prod"):
        (tmp_path / name).mkdir()
    local = build_world(tmp_path / "local", monkeypatch)
    _run(local, tmp_path / "local", _instance_knowing(local), tags=tags, dry_run=False)
    (record,) = list_housekeeping(local.store)
    assert (record["by"], record["actor"]["verified_by"]) == (getpass.getuser(), OS_USER)
    # On the production instance the run coordinator wrote them from the proxy's header.
    prod = build_world(tmp_path / "prod", monkeypatch)
    with instance_for_test(overrides=coordinator_config(trust=True)) as instance:
        _run(prod, tmp_path / "prod", _instance_knowing(prod, instance), tags=tags, dry_run=False)
    (record,) = list_housekeeping(prod.store)
    assert (record["by"], record["actor"]["verified_by"], record["actor"]["authenticated"]) == (
        "alice@example.com", AUTH_PROXY, True)
    assert "launch-1" in record["actor"]["detail"]
    assert describe_entry(record) == "alice@example.com (signed in through the authenticating proxy)"


def test_the_cli_apply_is_recorded_with_its_note_and_listed_by_history(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    home = tmp_path / "home"
    (home / "platform").mkdir(parents=True)
    w = build_world(home / "platform", monkeypatch)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("PLATFORM_PROFILE", "local")
    assert main(["housekeeping", "--older-than-days", str(OLDER_THAN_DAYS), "--apply", "--by", "ops on-call"]) == 0
    out = capsys.readouterr().out
    assert f'applied by {getpass.getuser()} (OS user, not authenticated), note "ops on-call"' in out
    (record,) = list_housekeeping(w.store)
    assert record["note"] == "ops on-call" and record["by"] == getpass.getuser()
    assert main(["housekeeping", "--history"]) == 0
    history = capsys.readouterr().out.splitlines()
    assert history[0].endswith(f'by {getpass.getuser()} (OS user, not authenticated), note "ops on-call"')
    assert any(line.strip().startswith("run-branch run-failed:") for line in history[1:])


def test_the_definitions_hold_the_job_and_a_stopped_daily_schedule(tmp_path, monkeypatch):
    from pipelines.definitions import build_definitions
    from pipelines.models import PIPELINES
    from pipelines.profiles import Profile

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    defs = build_definitions(Profile.from_environment(), PIPELINES)
    assert defs.resolve_job_def("store_housekeeping").name == "store_housekeeping"
    schedule = defs.resolve_schedule_def("store_housekeeping_daily")
    assert schedule.job_name == "store_housekeeping" and schedule.cron_schedule == "0 3 * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED and "Stopped by default" in schedule.description
    # On their own they carry no resources: build_definitions merges in the profile's.
    own = housekeeping_definitions()
    assert [j.name for j in own.jobs] == ["store_housekeeping"]
    assert [s.name for s in own.schedules] == ["store_housekeeping_daily"]
