"""An image folder's raw ingest over Dagster steps (assets/image_ingest_steps.py): the new parts
decoded in groups, each a step, published in one commit that equals the one-process ingest byte
for byte; a failed group retried alone, a group failed for good leaving main as it was, and a
re-execution from the failure redoing only that group."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from assets.kinds.image_ingest import finish_ingest, ingest_images, ingest_parts, plan_ingest
from assets.kinds.image_parts import INDEX_NAME
from assets.kinds.images import ImageKind
from core.spec import ImageFolder, PipelineSpec
from pipelines.models.shapes import CLASSES, draw_shape, shapes_dataset, write_shapes_source
from tests.data.test_images import encode, write_files
from tests.pipeline.conftest import Platform, failure_messages

RAW = "datasets/shapes/raw/"


def _spec(files_per_part: int = 8, parts_per_step: int = 2, files_per_chunk: int = 3) -> PipelineSpec:
    # a chunk smaller than a part: a part is checked over several chunks, as a large one is
    return dataclasses.replace(shapes_dataset, source=ImageFolder(
        root="shapes", files_per_part=files_per_part, parts_per_step=parts_per_step, files_per_chunk=files_per_chunk),
        split=dataclasses.replace(shapes_dataset.split, samples_per_shard=4))


def _bad_images(folder: Path) -> None:
    """Problems of every stage, spread over the folder's parts: too small, wrong mode, corrupt,
    empty, and a class folder that is not declared."""
    rng = np.random.default_rng(5)
    write_files(folder, {
        "circle/aa-small.png": encode(draw_shape("circle", rng, 96).resize((4, 4)), "PNG"),
        "square/mm-cmyk.jpg": encode(draw_shape("square", rng, 96).convert("CMYK"), "JPEG"),
        "triangle/zz-corrupt.jpg": encode(draw_shape("triangle", rng, 96), "JPEG")[:200],
        "triangle/bb-empty.jpg": b"",
        "hexagon/one.png": encode(Image.new("RGB", (32, 32)), "PNG"),
    })


def _files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "shapes").rglob("*") if p.is_file())


def _in_groups(spec: PipelineSpec, root: Path, out: Path, per_group: int, reverse: bool):
    """The three stages as the steps run them: a group's files written in a folder of its own, the
    groups' results handed to the finish in any order."""
    plan = plan_ingest(spec, _files(root), root)
    made, where = [], {}
    for i in range(0, len(plan.new), per_group):
        group_dir = out.parent / f"group-{i}"
        found = ingest_parts(spec, plan.new[i:i + per_group], group_dir, workers=2)
        made.append(found)
        where.update({key: group_dir for key in found["parts"]})
    part_of = {p.record["rows_table"]: p.record["key"] for p in plan.new}

    def rows_table(record: dict) -> Path | None:
        local = where[part_of[record["rows_table"]]] / record["rows_table"]
        return local if local.is_file() else None

    raw = finish_ingest(spec, plan.without_entries(), made[::-1] if reverse else made, out, rows_table)
    files = {p.relative_to(d).as_posix(): p.read_bytes() for d in {*where.values()} for p in d.rglob("*.parquet")}
    return raw, len(plan.new), files


@pytest.mark.parametrize("bad", [False, True], ids=["clean", "with-bad-images"])
def test_an_ingest_over_groups_of_parts_equals_one_pass_byte_for_byte(tmp_path, bad):
    root = tmp_path / "sources"
    write_shapes_source(root, per_class=12, seed=4)
    if bad:
        _bad_images(root / "shapes")
    spec = _spec(files_per_part=4)
    one = ingest_images(spec, _files(root), root, tmp_path / "one", workers=2)
    one_files = {p.relative_to(one.path).as_posix(): p.read_bytes() for p in one.path.rglob("*.parquet")}
    assert one.report.passed is not bad and len(one_files) >= 12
    if bad:  # every stage's problem is in the report, which a one-part step could not have judged alone
        text = "\n".join(one.report.failures)
        for name in ("aa-small.png", "mm-cmyk.jpg", "zz-corrupt.jpg", "bb-empty.jpg", "hexagon"):
            assert name in text, text
    for per_group, reverse in ((1, False), (2, True), (3, False), (100, False)):
        out = tmp_path / f"steps-{per_group}" / "raw"
        raw, parts, files = _in_groups(spec, root, out, per_group, reverse)
        assert parts >= 6
        assert raw.report.to_json() == one.report.to_json(), per_group
        assert (out / INDEX_NAME).read_bytes() == (one.path / INDEX_NAME).read_bytes()
        assert files == one_files
        assert (raw.rows, raw.sources, raw.parts) == (one.rows, one.sources, one.parts)


# --- over Dagster steps ----------------------------------------------------------------------------

def _ingest_steps(result) -> list[str]:
    return [e.step_key for e in result.all_events if e.is_step_success and "_ingest_parts[" in e.step_key]


def _raw_files(store, ref: str) -> dict[str, bytes]:
    return {o.path: store.get_object(ref, o.path) for o in store.list_objects(ref, prefix=RAW)}


def _one_pass(store, spec: PipelineSpec, root: Path, key: dict, previous_commit: str | None, tmp: Path):
    """What one process makes of the same folder on the same previous version."""
    from assets.kinds.image_store import previous_parts

    files = sorted(p for p in (root / "shapes").rglob("*") if p.is_file())
    previous = previous_parts(store, previous_commit, RAW, tmp / "previous")
    return ingest_images(spec, files, root, tmp / "one", salt=key["parameters"] + key["code"], previous=previous)


def _raw_value(result) -> dict:
    return next(e for e in result.get_asset_materialization_events()
                if e.asset_key.path[-1] == "raw_dataset").materialization.metadata


def test_the_raw_ingest_runs_in_steps_publishes_one_commit_and_equals_one_pass_also_on_an_edited_folder(
        platform, tmp_path):
    folder = write_shapes_source(platform.sources, per_class=30, seed=3)
    spec = _spec()
    store = platform.store()
    result = platform.run(spec)
    assert result.success, failure_messages(result)
    first_raw = [c for c in store.log(f"run-{result.run_id}") if c.message.startswith("Ingest raw data")]
    assert len(first_raw) == 1  # every step's raw files in one commit
    index = json.loads(store.get_object(first_raw[0].id, RAW + INDEX_NAME))
    assert len(_ingest_steps(result)) == -(-len(index["parts"]) // 2) >= 4  # two parts a step
    meta = _raw_value(result)
    assert meta["ingest_steps"].value == len(_ingest_steps(result)) and meta["parts_made"].value == len(index["parts"])

    # the folder edited: a new version, its changed parts ingested over steps, its kept parts not read
    rng = np.random.default_rng(9)
    write_files(folder, {f"{k}/new-{i}.jpg": encode(draw_shape(k, rng, 96), "JPEG") for k in CLASSES for i in range(2)})
    sorted(folder.glob("circle/*.jpg"))[5].write_bytes(encode(draw_shape("circle", rng, 96), "JPEG"))
    published = {c.id for c in store.log("main")}
    second = platform.run(spec)
    assert second.success, failure_messages(second)
    (raw_commit,) = [c for c in store.log(f"run-{second.run_id}")
                     if c.id not in published and c.message.startswith("Ingest raw data")]
    meta = _raw_value(second)
    assert 0 < meta["parts_made"].value < meta["parts_reused"].value
    assert len(_ingest_steps(second)) == -(-meta["parts_made"].value // 2)

    # byte for byte what one process makes of the same folder on the same previous version
    data_key = json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))["data_key"]
    one = _one_pass(store, spec, platform.sources, data_key, first_raw[0].id, tmp_path)
    on_commit = _raw_files(store, raw_commit.id)
    assert on_commit[RAW + INDEX_NAME] == (one.path / INDEX_NAME).read_bytes()
    for path in (p for p in on_commit if p.endswith(".parquet")):
        local = one.path / path[len(RAW):]
        assert not local.is_file() or local.read_bytes() == on_commit[path], path  # new parts: made alike
    made_here = {p.relative_to(one.path).as_posix() for p in one.path.rglob("*.parquet")}
    assert made_here and made_here <= {p[len(RAW):] for p in on_commit}
    report = store.get_object(raw_commit.id, "datasets/shapes/validation/raw_dataset.json")
    assert report == one.report.to_json()
    assert on_commit[RAW + "sources.json"] == json.dumps(one.sources, indent=2, sort_keys=True).encode()

    # the same folder again: the version is reused, nothing is planned into steps, and the run
    # still materialises both assets (a plan that yields no group must not skip publish)
    third = platform.run(spec)
    assert third.success, failure_messages(third)
    assert not _ingest_steps(third)
    reused = {e.asset_key.path[-1]: e.materialization.metadata for e in third.get_asset_materialization_events()}
    assert reused["raw_dataset"]["reused_dataset_version"].value == reused["shards"]["dataset_version"].value
    assert reused["raw_dataset"]["commit_id"].value == raw_commit.id


def test_a_failed_group_is_retried_alone_and_one_failed_for_good_leaves_main_unchanged(platform, monkeypatch):
    write_shapes_source(platform.sources, per_class=30, seed=3)
    spec = _spec()
    calls: dict[tuple[str, ...], int] = {}
    ingest = ImageKind.ingest_parts

    def flaky(self, spec_, parts, out):
        names = tuple(p.record["name"] for p in parts)
        calls[names] = calls.get(names, 0) + 1
        if len(calls) == 2 and calls[names] == 1:  # the second group's first attempt: a node that went away
            raise ConnectionError("the store dropped the connection")
        return ingest(self, spec_, parts, out)

    monkeypatch.setattr(ImageKind, "ingest_parts", flaky)
    result = platform.run(spec)

    assert result.success, failure_messages(result)
    assert len(calls) >= 4 and sorted(calls.values()) == [1] * (len(calls) - 1) + [2]  # one group retried, alone
    store = platform.store()
    assert len([c for c in store.log(f"run-{result.run_id}") if c.message.startswith("Ingest raw data")]) == 1
    assert _raw_files(store, "main")  # published whole

    # A group that fails on every attempt: the run fails before the raw commit, main keeps its version.
    main = store.resolve_ref("main")
    write_files(platform.sources / "shapes", {"circle/late.jpg": encode(draw_shape("circle", np.random.default_rng(1),
                                                                                   96), "JPEG")})
    calls.clear()

    def down(self, spec_, parts, out):
        calls[tuple(p.record["name"] for p in parts)] = calls.get(tuple(p.record["name"] for p in parts), 0) + 1
        raise ConnectionError("the store is down")

    monkeypatch.setattr(ImageKind, "ingest_parts", down)
    failed = platform.run(spec)

    assert not failed.success, "the run passed"
    assert "Exceeded max_retries of 2" in failure_messages(failed), failure_messages(failed)
    assert list(calls.values()) == [3]  # the one new part's group: its first attempt and the policy's two retries
    assert store.resolve_ref("main") == main
    on_main = {c.id for c in store.log("main")}
    assert not [c for c in store.log(f"run-{failed.run_id}") if c.id not in on_main]


# A job Dagster can rebuild by reference: a re-execution from failure needs one.
DATA_ROOT_VAR = "IMAGE_INGEST_STEPS_TEST_DATA_ROOT"


def image_ingest_steps_job():
    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.profiles import Profile

    profile = Profile(name="local", data_root=Path(os.environ[DATA_ROOT_VAR]))
    return build_definitions(profile, [_spec()], with_yaml=False).resolve_job_def(training_job_name(_spec()))


def test_a_re_execution_from_failure_ingests_only_the_failed_group_and_publishes_the_whole_version(
        platform, monkeypatch, tmp_path):
    """The re-execution runs on a branch of its own: the groups that passed staged their files on
    the first run's branch, and publish copies them from there into the one commit."""
    import dagster as dg

    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    write_shapes_source(platform.sources, per_class=30, seed=3)
    calls: list[tuple[str, ...]] = []
    ingest = ImageKind.ingest_parts

    def second_group_fails(self, spec_, parts, out):
        calls.append(tuple(p.record["name"] for p in parts))
        if len(calls) == 2:  # a problem no retry fixes: the run fails
            raise dg.Failure("the group's volume is gone", allow_retries=False)
        return ingest(self, spec_, parts, out)

    monkeypatch.setattr(ImageKind, "ingest_parts", second_group_fails)
    job = dg.reconstructable(image_ingest_steps_job)
    with platform.instance:
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False) as first:
            assert not first.success
            first_id = first.run_id
        store = platform.store()
        assert not [c for c in store.log(f"run-{first_id}") if c.message.startswith("Ingest")]
        assert not store.list_objects("main", prefix="datasets/shapes/")  # nothing published
        failed_group, groups = calls[1], len(calls)
        counted: list[tuple[str, ...]] = []

        def counting(self, spec_, parts, out):
            counted.append(tuple(p.record["name"] for p in parts))
            return ingest(self, spec_, parts, out)

        monkeypatch.setattr(ImageKind, "ingest_parts", counting)
        options = dg.ReexecutionOptions.from_failure(first_id, platform.instance)
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False,
                            reexecution_options=options) as again:
            assert again.success, [e.message for e in again.all_events if e.is_failure]
            again_id = again.run_id

    assert groups >= 4 and counted == [failed_group]  # the other groups' results came from the first run
    (raw_commit,) = [c.id for c in store.log(f"run-{again_id}") if c.message.startswith("Ingest raw data")]
    index = json.loads(store.get_object("main", RAW + INDEX_NAME))
    on_main = {o.path for o in store.list_objects("main", prefix=RAW)}
    assert {RAW + p[k] for p in index["parts"] for k in ("raw", "rows_table")} <= on_main
    # and it is the version one pass makes
    one = ingest_images(_spec(), sorted(p for p in (platform.sources / "shapes").rglob("*") if p.is_file()),
                        platform.sources, tmp_path / "one", salt=index["salt"])
    assert store.get_object("main", RAW + INDEX_NAME) == (one.path / INDEX_NAME).read_bytes()
    assert all(store.get_object("main", RAW + p.relative_to(one.path).as_posix()) == p.read_bytes()
               for p in one.path.rglob("*.parquet"))
    assert store.get_object(raw_commit, "datasets/shapes/validation/raw_dataset.json") == one.report.to_json()


def test_a_folder_in_the_stores_sources_area_is_fetched_by_each_step_and_makes_the_same_raw_copy(
        platform, monkeypatch, tmp_path):
    """The plan's copy of a store's files lies in its own step's temporary folder (another pod on
    Kubernetes): each group downloads its own parts' files from the run's source commit, no more."""
    from pipelines.sources import add_source_files, plan_uploads

    folder = write_shapes_source(tmp_path / "elsewhere", per_class=30, seed=3)
    store = platform.store()
    store.ensure_repository()
    spec = _spec()
    add_source_files(store, spec, plan_uploads(spec, [folder]))
    read: list[int] = []
    ingest = ImageKind.ingest_parts

    def counting(self, spec_, parts, out):
        paths = [e.path for p in parts for e in p.entries]
        (fetched,) = {p.parents[2] for p in paths}  # <step's folder>/shapes/<class>/<file>
        # this group's files and no other, fetched by this step (the plan's copy is gone)
        assert sorted(f for f in fetched.rglob("*") if f.is_file()) == sorted(paths)
        read.append(len(paths))
        return ingest(self, spec_, parts, out)

    monkeypatch.setattr(ImageKind, "ingest_parts", counting)
    result = platform.run(spec)
    assert result.success, failure_messages(result)
    logs = [e.user_message for e in platform.instance.all_logs(result.run_id)]
    assert any("from the store's sources/ area" in m for m in logs), logs
    assert len(read) == len(_ingest_steps(result)) >= 4 and sum(read) == 90
    index = json.loads(store.get_object("main", RAW + INDEX_NAME))
    one = ingest_images(spec, _files(tmp_path / "elsewhere"), tmp_path / "elsewhere", tmp_path / "one",
                        salt=index["salt"])
    assert store.get_object("main", RAW + INDEX_NAME) == (one.path / INDEX_NAME).read_bytes()
    assert all(store.get_object("main", RAW + p.relative_to(one.path).as_posix()) == p.read_bytes()
               for p in one.path.rglob("*.parquet"))


@pytest.mark.slow
def test_run_with_the_multiprocess_executor_the_groups_ingest_in_processes_of_their_own_and_make_the_same_raw_copy(
        platform, monkeypatch, tmp_path):
    """Locally a run that asks for processes (pipelines/profiles.py's executor) ingests its groups
    side by side, each with its own decoding pool: what one machine's cores give."""
    import dagster as dg

    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    write_shapes_source(platform.sources, per_class=30, seed=3)
    config = {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}}
    with platform.instance:
        with dg.execute_job(dg.reconstructable(image_ingest_steps_job), instance=platform.instance, run_config=config,
                            raise_on_error=False) as result:
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            pids = {e.step_key: e.pid for e in result.all_events if e.is_step_start}
    groups = {k: pid for k, pid in pids.items() if "_ingest_parts[" in k}
    assert len(groups) >= 4 and len(set(pids.values())) == len(pids)  # every step in a process of its own
    store = platform.store()
    index = json.loads(store.get_object("main", RAW + INDEX_NAME))
    one = ingest_images(_spec(), _files(platform.sources), platform.sources, tmp_path / "one", salt=index["salt"])
    assert store.get_object("main", RAW + INDEX_NAME) == (one.path / INDEX_NAME).read_bytes()
    assert all(store.get_object("main", RAW + p.relative_to(one.path).as_posix()) == p.read_bytes()
               for p in one.path.rglob("*.parquet"))
