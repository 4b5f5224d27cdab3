"""Re-executions from failure on lakeFS (the lakeFS-API test server over HTTP) copy what an earlier
run staged or committed with the store's own copy: no byte of it passes through the step.

A re-execution runs on a branch of its own, made from main. Its raw publish takes the parts the
first run's passing ingest groups staged on that run's branch (assets/kinds/image_store.py
``_sync``), and its shards publish carries the first run's raw commit onto its branch
(assets/shard_steps.py ``carry_raw_commit``). The server counts the object bytes it sends by
path: a part's image bytes are sent only to a step that decodes or shards it, never for a copy.
And the version is the one a run in one go makes, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from assets.kinds.image_ingest import ingest_images
from assets.kinds.image_parts import INDEX_NAME, RAW_DIR
from assets.kinds.images import ImageKind
from assets.pipeline import build_pipeline_assets
from pipelines.models.shapes import write_shapes_source
from resources.platform import ArtifactStoreResource, PlatformSettings, TrainingLauncherResource, VersionedStoreResource
from tests.data.test_image_ingest_steps import _spec
from tests.support.lakefs_server import LakeFSTestServer

pytestmark = pytest.mark.slow

RAW = "datasets/shapes/raw/"
# Where the reconstructable job below finds the data root and the test server, set by each test.
# Read when the run starts its resources (dg.EnvVar): Dagster keeps a job it rebuilt by reference
# for the rest of the process, so a value built into the definitions would be the first test's.
ENV = {name: f"COPIES_IN_RUNS_{name.upper()}" for name in ("root", "artifacts", "launches", "endpoint", "key",
                                                           "secret")}


def lakefs_data_job() -> dg.JobDefinition:
    """The image folder's raw copy and shards, with the store on the test server: a job Dagster can
    rebuild by reference, as a re-execution from failure needs."""
    store = VersionedStoreResource(kind="lakefs", repository="copies", lakefs_endpoint=dg.EnvVar(ENV["endpoint"]),
                                   lakefs_access_key_id=dg.EnvVar(ENV["key"]),
                                   lakefs_secret_access_key=dg.EnvVar(ENV["secret"]),
                                   lakefs_storage_namespace="local://copies")
    spec = _spec()
    defs = dg.Definitions(
        assets=build_pipeline_assets(spec),
        jobs=[dg.define_asset_job("data", selection=[dg.AssetKey([spec.name, s]) for s in ("raw_dataset", "shards")])],
        resources={"platform": PlatformSettings(data_root=dg.EnvVar(ENV["root"])), "store": store,
                   "artifacts": ArtifactStoreResource(kind="local", local_root=dg.EnvVar(ENV["artifacts"])),
                   "launcher": TrainingLauncherResource(kind="local", work_root=dg.EnvVar(ENV["launches"]))},
        executor=dg.in_process_executor)
    return defs.resolve_job_def("data")


@pytest.fixture
def lakefs(tmp_path: Path, monkeypatch):
    """(the test server, the store, a Dagster instance), the job pointed at them."""
    with LakeFSTestServer(tmp_path / "lakefs") as server:
        root = tmp_path / "platform"
        write_shapes_source(root / "sources", per_class=30, seed=3)
        for name, value in {"root": root, "artifacts": root / "artifacts", "launches": root / "launches",
                            "endpoint": server.endpoint, "key": server.access_key_id,
                            "secret": server.secret_access_key}.items():
            monkeypatch.setenv(ENV[name], str(value))
        store = VersionedStoreResource(kind="lakefs", repository="copies", lakefs_endpoint=server.endpoint,
                                       lakefs_access_key_id=server.access_key_id,
                                       lakefs_secret_access_key=server.secret_access_key).get()
        (tmp_path / "home").mkdir()
        with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
            yield server, store, instance, root


def _failing_call(monkeypatch, name: str, which: int, describe) -> list:
    """Make call ``which`` (1-based; 0: none) of ``ImageKind.<name>`` fail for good; returns what
    ``describe`` says of each call's group (its argument after the spec), to tell the groups apart."""
    real = getattr(ImageKind, name)
    calls: list = []

    def maybe_failing(self, spec, group, *args, **kwargs):
        calls.append(describe(group))
        if len(calls) == which:  # a problem no retry fixes: the run fails
            raise dg.Failure("this group's volume is gone", allow_retries=False)
        return real(self, spec, group, *args, **kwargs)

    monkeypatch.setattr(ImageKind, name, maybe_failing)
    return calls


def _ingest_group(parts) -> tuple[str, ...]:
    return tuple(p.record["name"] for p in parts)


def _shard_group(raw_dir: Path) -> set[str]:
    """The raw part files a shard step was given (its folder goes with the step)."""
    return {RAW + p["raw"] for p in json.loads((raw_dir / INDEX_NAME).read_text())["parts"]}


def _run(instance, options: dg.ReexecutionOptions | None = None) -> tuple[bool, str, list[str]]:
    """(success, the run's id, its step failures)."""
    with dg.execute_job(dg.reconstructable(lakefs_data_job), instance=instance, raise_on_error=False,
                        reexecution_options=options) as result:
        return result.success, result.run_id, [e.message for e in result.all_events if e.is_step_failure]


def _part_files(store, ref: str) -> dict[str, int]:
    """The raw copy's part files (the images' bytes) at ``ref``, path -> size."""
    index = json.loads(store.get_object(ref, RAW + INDEX_NAME))
    return {RAW + p["raw"]: store.stat_object(ref, RAW + p["raw"]).size_bytes for p in index["parts"]}


def _sent(server: LakeFSTestServer, paths) -> dict[str, int]:
    return {p: server.served(p) for p in paths}


def _equals_one_pass(store, root: Path, tmp: Path) -> None:
    index = json.loads(store.get_object("main", RAW + INDEX_NAME))
    one = ingest_images(_spec(), sorted(p for p in (root / "sources" / "shapes").rglob("*") if p.is_file()),
                        root / "sources", tmp, salt=index["salt"])
    assert store.get_object("main", RAW + INDEX_NAME) == (one.path / INDEX_NAME).read_bytes()
    made = {RAW + p.relative_to(one.path).as_posix(): p.read_bytes() for p in one.path.rglob("*.parquet")}
    assert {o.path for o in store.list_objects("main", prefix=RAW) if o.path.endswith(".parquet")} == set(made)
    assert all(store.get_object("main", path) == data for path, data in made.items())


def test_a_re_executed_ingest_copies_the_first_runs_staged_parts_without_reading_them(lakefs, monkeypatch, tmp_path):
    server, store, instance, root = lakefs
    calls = _failing_call(monkeypatch, "ingest_parts", 2, _ingest_group)
    ok, first, failures = _run(instance)
    assert not ok and len(calls) >= 4 and len(failures) == 1, failures
    staged_first = {o.path: o.size_bytes for o in store.list_objects(f"run-{first}", prefix=RAW + RAW_DIR + "/")}
    assert staged_first  # the passing groups' parts, staged on the first run's branch only
    assert not store.list_objects("main", prefix=RAW)
    sent_before = _sent(server, staged_first)
    redone = _failing_call(monkeypatch, "ingest_parts", 0, _ingest_group)

    ok, _, failures = _run(instance, dg.ReexecutionOptions.from_failure(first, instance))

    assert ok, failures
    assert redone == [calls[1]]  # only the failed group decoded again
    on_main = _part_files(store, "main")
    assert set(staged_first) < set(on_main)
    # the shards step downloads every part once to shard it; the copy into the version added nothing
    sent = {p: n - sent_before[p] for p, n in _sent(server, staged_first).items()}
    print(f"\nre-executed ingest on lakeFS: {sum(sent.values())} bytes of the first run's {len(sent)} staged "
          f"part file(s) ({sum(staged_first.values())} bytes) sent (pytest -s)")
    assert sent == staged_first
    _equals_one_pass(store, root, tmp_path / "one")


def test_a_re_executed_shard_group_carries_the_raw_commit_without_reading_it(lakefs, monkeypatch, tmp_path):
    server, store, instance, root = lakefs
    calls = _failing_call(monkeypatch, "shard", 2, _shard_group)
    ok, first, failures = _run(instance)
    assert not ok and len(calls) >= 3 and len(failures) == 1, failures
    (raw_commit,) = [c.id for c in store.log(f"run-{first}") if c.message.startswith("Ingest raw data")]
    parts = _part_files(store, raw_commit)
    failed_group = calls[1]
    sent_before = _sent(server, parts)
    redone = _failing_call(monkeypatch, "shard", 0, _shard_group)

    ok, _, failures = _run(instance, dg.ReexecutionOptions.from_failure(first, instance))

    assert ok, failures
    assert redone == [failed_group]
    # the raw commit is on main with the shards, yet only the failed group's parts were sent, once,
    # to the step that sharded them again: the carry of the whole raw commit sent nothing
    sent = {p: n - sent_before[p] for p, n in _sent(server, parts).items()}
    print(f"\nre-executed shard group on lakeFS: {sum(sent.values())} bytes of the raw commit's {len(parts)} part "
          f"file(s) ({sum(parts.values())} bytes) sent, the failed group's {len(failed_group)} (pytest -s)")
    assert sent == {p: (size if p in failed_group else 0) for p, size in parts.items()}
    assert all(store.get_object("main", p) == store.get_object(raw_commit, p)
               for p in [o.path for o in store.list_objects(raw_commit, prefix=RAW)])
    assert json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))["source_commit"] == raw_commit
    _equals_one_pass(store, root, tmp_path / "one")
