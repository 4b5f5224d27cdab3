"""An image folder kept in parts: a new version costs what changed (issue 41, item 3).

The unit tests hold the cutting rule to its promise (an edit moves only the parts it falls in);
the pipeline test edits a published folder (files added, one changed, one removed) and checks the
new version's commit, what was read again, and that the version equals one made from scratch."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from assets.kinds.image_parts import cut_points, plan_parts, split_into_parts
from core.datasets import dataset_tags
from assets.kinds.images import ImageKind
from core.spec import ImageFolder, PipelineSpec
from pipelines.models.shapes import CLASSES, draw_shape, shapes_dataset, write_shapes_source
from tests.data.test_images import encode, read_shards, write_files
from tests.pipeline.conftest import Platform, failure_messages


def _ids(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return sorted({f"{rng.choice(CLASSES)}/{rng.getrandbits(40):010x}.jpg" for _ in range(n)})


def _parts(ids: list[str], target: int) -> list[tuple[str, ...]]:
    stops = cut_points(ids, target)
    return [tuple(ids[a:b]) for a, b in zip([0, *stops], stops)]


def test_parts_cover_every_id_once_within_their_size_bounds():
    ids = _ids(20_000)
    parts = _parts(ids, 256)
    assert [i for p in parts for i in p] == ids
    assert all(64 <= len(p) <= 1024 for p in parts[:-1]) and 1 <= len(parts[-1]) <= 1024
    assert 0.5 < len(ids) / len(parts) / 256 < 1.5  # about ``target`` images a part, on average


def _members(ids, label=lambda i: i.split("/")[0], sha=lambda i: "0" * 64):
    return [(i, label(i), sha(i)) for i in ids]


@pytest.mark.parametrize("edit", ["add 1%", "remove 1%", "change 20 files"])
def test_a_new_version_keeps_every_part_an_edit_leaves_whole_and_remakes_only_the_rest(edit):
    ids = _ids(20_000)
    rng = random.Random(1)
    first = split_into_parts(_members(ids), 256, "salt")
    previous = [(p.key, _members(ids[p.start:p.stop])) for p in first]
    if edit == "add 1%":
        added = sorted(set(_ids(200, seed=2)) - set(ids))
        now, touched = _members(sorted(set(ids) | set(added))), set()
    elif edit == "remove 1%":
        touched = set(rng.sample(ids, 200))
        now = _members(sorted(set(ids) - touched))
    else:
        touched = set(rng.sample(ids, 20))
        now = _members(ids, sha=lambda i: "1" * 64 if i in touched else "0" * 64)

    kept, rest, new = plan_parts(now, 256, "salt", previous)

    dissolved = [p for p in first if set(ids[p.start:p.stop]) & touched]
    assert set(kept) == {p.key for p in first} - {p.key for p in dissolved}
    remade = {now[i][0] for i in rest}
    if edit == "add 1%":  # added images cost themselves, wherever their names fall
        assert remade == set(added) and len(new) <= 2
    else:  # a changed or removed image costs its part: the part's other images are remade with it
        held = {i for p in dissolved for i in ids[p.start:p.stop]}
        assert remade == (held - touched if edit == "remove 1%" else held)
        assert len(dissolved) <= len(touched)
    assert sorted(i for p in new for i in (now[j][0] for j in rest[p.start:p.stop])) == sorted(remade)
    assert plan_parts(now, 256, "other salt", previous)[0] == []  # other parameters or code: nothing kept


def test_a_part_key_depends_on_the_salt_and_the_members_its_name_on_the_members():
    members = [(f"a/{i}.png", "a", f"{i:064x}") for i in range(10)]
    (one,) = split_into_parts(members, 100, "s1")
    (two,) = split_into_parts(members, 100, "s2")
    (three,) = split_into_parts([*members[:9], ("a/9.png", "a", "f" * 64)], 100, "s1")
    assert one.key != two.key and one.name == two.name  # other parameters: new data, same file names
    assert one.key != three.key and one.name != three.name  # a changed file: a new part


# --- a published folder, edited --------------------------------------------------------------------

def _spec() -> PipelineSpec:
    # 90 JPEGs and parts of about 8: a dozen parts, so an edit leaves most of them alone
    return dataclasses.replace(shapes_dataset, source=ImageFolder(root="shapes", files_per_part=8, parts_per_step=2),
                               split=dataclasses.replace(shapes_dataset.split, samples_per_shard=4))


def _shard_steps(result) -> int:
    return sum(1 for e in result.all_events if e.is_step_success and "_shard_parts[" in e.step_key)


def _manifest(store) -> dict:
    return json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))


def test_an_edited_folder_makes_a_version_that_writes_only_the_changed_parts_and_equals_one_made_from_scratch(
        tmp_path):
    edited = Platform(tmp_path / "edited")
    folder = write_shapes_source(edited.sources, per_class=30, seed=3)
    spec = _spec()
    with edited.instance:
        first = edited.run(spec)
        assert first.success, failure_messages(first)
        store = edited.store()
        before = _manifest(store)
        parts_before = {p["key"] for p in before["parts"]}
        assert len(parts_before) >= 8

        rng = np.random.default_rng(9)
        write_files(folder, {f"{k}/new-{i}.jpg": encode(draw_shape(k, rng, 96), "JPEG") for k in CLASSES
                             for i in range(1)})  # 3 added
        changed = sorted(folder.glob("circle/*.jpg"))[5]
        changed.write_bytes(encode(draw_shape("circle", rng, 96), "JPEG"))  # 1 changed
        removed = sorted(folder.glob("square/*.jpg"))[7]
        removed.unlink()  # 1 removed

        second = edited.run(spec)

        assert second.success, failure_messages(second)
        tags = dataset_tags(store, "shapes")
        assert set(tags) == {1, 2}
        after = _manifest(store)
        new_parts = [p for p in after["parts"] if p["key"] not in parts_before]
        # the 3 added images, and the parts that held the changed and the removed one, remade
        assert 1 <= len(new_parts) <= 5 and len(new_parts) < len(after["parts"]) // 2
        assert len(parts_before - {p["key"] for p in after["parts"]}) <= 2
        # exactly the parts that held the changed and the removed image are dropped, no other
        touched = {changed.relative_to(folder).as_posix(), removed.relative_to(folder).as_posix()}
        holders = {p["key"] for p in before["parts"] if any(p["first_id"] <= i <= p["last_id"] for i in touched)}
        assert parts_before - {p["key"] for p in after["parts"]} == holders and 1 <= len(holders) <= 2
        # and the new parts hold exactly the images read again: those the dropped parts' ranges hold
        # now (the changed one among them, the removed one gone) and the 3 added
        now = sorted(f.relative_to(folder).as_posix() for f in folder.rglob("*") if f.is_file())
        added = {f"{k}/new-0.jpg" for k in CLASSES}

        def held(parts) -> set[str]:
            return {i for i in now if any(p["first_id"] <= i <= p["last_id"] for p in parts)}

        assert held(new_parts) == held([p for p in before["parts"] if p["key"] in holders]) | added
        raw = next(e for e in second.get_asset_materialization_events()
                   if e.asset_key.path[-1] == "raw_dataset").materialization.metadata
        assert raw["parts_reused"].value == len(after["parts"]) - len(new_parts)
        assert raw["parts_made"].value == len(new_parts)
        logs = [e.user_message for e in edited.instance.all_logs(second.run_id)]
        assert any(f"{len(new_parts)} of {len(after['parts'])} part(s) changed" in m for m in logs), logs
        steps = -(-len(new_parts) // 2)  # the new parts, 2 to a Dagster step
        assert any(f"{len(new_parts)} of {len(after['parts'])} part(s) to shard, in {steps} step(s)" in m
                   for m in logs), logs
        assert _shard_steps(second) == steps

        # The new version's commit adds and removes the files of the changed parts, nothing else.
        diff = store.diff(tags[1], tags[2], prefix="datasets/shapes/")
        shard_paths = {"datasets/shapes/shards/" + e["path"] for s in after["splits"].values() for e in s["shards"]}
        old_shard_paths = {"datasets/shapes/shards/" + e["path"] for s in before["splits"].values() for e in s["shards"]}
        touched = {d.path for d in diff}
        new_names = {p["name"] for p in new_parts}
        gone_names = {p["name"] for p in before["parts"]} - {p["name"] for p in after["parts"]}
        for path in touched:
            if "/shards/" in path and path.endswith(".bin"):
                assert path.rsplit("/", 1)[-1].split("-")[0] in new_names | gone_names, path
            elif "/raw/image" in path:
                assert path.rsplit("/", 1)[-1].removesuffix(".parquet") in new_names | gone_names, path
        kept = (shard_paths & old_shard_paths) - touched
        assert len(kept) > len(shard_paths) // 2  # most shards were neither rewritten nor re-uploaded

        edited_shards = read_shards(store, after, tmp_path / "read-edited")
        ids = {i for ids_, _, _ in edited_shards.values() for i in ids_}
        assert "circle/new-0.jpg" in ids and removed.relative_to(folder).as_posix() not in ids

    # The same folder ingested from nothing: other parts, the same samples, splits and pixels.
    fresh = Platform(tmp_path / "fresh")
    fresh.sources.mkdir(parents=True)
    shutil.copytree(folder, fresh.sources / "shapes")
    with fresh.instance:
        result = fresh.run(spec)
        assert result.success, failure_messages(result)
        scratch = read_shards(fresh.store(), _manifest(fresh.store()), tmp_path / "read-fresh")
    for split, (ids_, labels, images) in scratch.items():
        mine, my_labels, my_images = edited_shards[split]
        order, my_order = np.argsort(ids_), np.argsort(mine)
        assert sorted(ids_) == sorted(mine), split
        assert np.array_equal(labels[order], my_labels[my_order]) and np.array_equal(images[order], my_images[my_order])


def test_the_parts_are_sharded_over_steps_a_failed_one_is_retried_alone_and_a_version_is_one_commit(
        platform, monkeypatch):
    write_shapes_source(platform.sources, per_class=30, seed=3)
    spec = _spec()
    calls: dict[str, int] = {}
    shard = ImageKind.shard

    def flaky(self, spec_, raw_dir, out_dir, previous=None):
        names = tuple(p["name"] for p in json.loads((raw_dir / "parts.json").read_text())["parts"])
        calls[names] = calls.get(names, 0) + 1
        if len(calls) == 2 and calls[names] == 1:  # the second group's first attempt: a store that dropped out
            raise ConnectionError("the store dropped the connection")
        return shard(self, spec_, raw_dir, out_dir, previous)

    monkeypatch.setattr(ImageKind, "shard", flaky)
    result = platform.run(spec)

    assert result.success, failure_messages(result)
    assert len(calls) >= 3 and sorted(calls.values()) == [1] * (len(calls) - 1) + [2]  # one group retried, alone
    store = platform.store()
    manifest = _manifest(store)
    assert _shard_steps(result) == len(calls) == -(-len(manifest["parts"]) // 2)
    shards_commits = [c for c in store.log(f"run-{result.run_id}") if c.message.startswith("Shard shapes")]
    assert len(shards_commits) == 1  # every step's files in one commit

    # A group that fails for good: the run fails before that commit, and main keeps the version it had.
    main = store.resolve_ref("main")
    write_files(platform.sources / "shapes", {"circle/late.jpg": encode(draw_shape("circle", np.random.default_rng(1),
                                                                                   96), "JPEG")})
    calls.clear()

    def broken(self, spec_, raw_dir, out_dir, previous=None):
        raise ValueError("the preprocessing cannot read this part")

    monkeypatch.setattr(ImageKind, "shard", broken)
    failed = platform.run(spec)

    assert not failed.success and "cannot shard the raw data: the preprocessing cannot read" in failure_messages(failed)
    assert store.resolve_ref("main") == main
    on_main = {c.id for c in store.log("main")}
    assert not [c for c in store.log(f"run-{failed.run_id}") if c.id not in on_main and c.message.startswith("Shard")]


# A job Dagster can rebuild by reference: a re-execution from failure needs one, with the first
# run's outputs in the instance's storage.
DATA_ROOT_VAR = "IMAGE_STEPS_TEST_DATA_ROOT"


def image_steps_job():
    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.profiles import Profile

    profile = Profile(name="local", data_root=Path(os.environ[DATA_ROOT_VAR]))
    return build_definitions(profile, [_spec()], with_yaml=False).resolve_job_def(training_job_name(_spec()))


def test_a_re_execution_from_failure_redoes_only_the_failed_group_and_main_gets_the_raw_copy_too(
        platform, monkeypatch):
    """The re-execution runs on a branch of its own, made from main, which the first run's raw
    commit never reached: publish stages that commit's files beside the shards, so main never holds
    shards without the raw copy they were made from."""
    import dagster as dg

    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    write_shapes_source(platform.sources, per_class=30, seed=3)
    calls: list[tuple[str, ...]] = []
    shard = ImageKind.shard

    def second_group_fails(self, spec_, raw_dir, out_dir, previous=None):
        names = tuple(p["name"] for p in json.loads((raw_dir / "parts.json").read_text())["parts"])
        calls.append(names)
        if len(calls) == 2:  # a problem no retry fixes: the run fails
            raise ValueError("the preprocessing cannot read this part")
        return shard(self, spec_, raw_dir, out_dir, previous)

    monkeypatch.setattr(ImageKind, "shard", second_group_fails)
    job = dg.reconstructable(image_steps_job)
    with platform.instance:
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False) as first:
            assert not first.success
            first_id = first.run_id
        store = platform.store()
        (raw_commit,) = [c.id for c in store.log(f"run-{first_id}") if c.message.startswith("Ingest")]
        assert not store.list_objects("main", prefix="datasets/shapes/")  # nothing published
        failed_group = calls[1]
        calls.clear()
        monkeypatch.setattr(ImageKind, "shard", shard)
        counted = []

        def counting(self, spec_, raw_dir, out_dir, previous=None):
            counted.append(tuple(p["name"] for p in json.loads((raw_dir / "parts.json").read_text())["parts"]))
            return shard(self, spec_, raw_dir, out_dir, previous)

        monkeypatch.setattr(ImageKind, "shard", counting)
        options = dg.ReexecutionOptions.from_failure(first_id, platform.instance)
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False,
                            reexecution_options=options) as again:
            assert again.success, [e.message for e in again.all_events if e.is_failure]

    assert counted == [failed_group]  # the other groups' outputs came from the first run
    raw_on_main = sorted(o.path for o in store.list_objects("main", prefix="datasets/shapes/raw/"))
    raw_made = sorted(o.path for o in store.list_objects(raw_commit, prefix="datasets/shapes/raw/"))
    assert raw_on_main == raw_made and raw_on_main
    assert all(store.get_object("main", path) == store.get_object(raw_commit, path) for path in raw_on_main)
    assert _manifest(store)["source_commit"] == raw_commit


def test_how_the_work_is_spread_is_not_part_of_the_data_key():
    from assets.data_key import parameters

    spec = _spec()
    wider = dataclasses.replace(spec, source=dataclasses.replace(spec.source, parts_per_step=64))
    finer = dataclasses.replace(spec, source=dataclasses.replace(spec.source, files_per_part=16))
    assert parameters(wider) == parameters(spec) != parameters(finer)


@pytest.mark.parametrize("field", ["files_per_part", "parts_per_step"])
def test_a_part_or_step_size_below_one_is_refused_naming_the_field(field):
    from core.spec import dataset_pipeline
    from core.spec_fields import PipelineDefinitionError

    with pytest.raises(PipelineDefinitionError, match=rf"source\.{field}.*at least 1"):
        dataset_pipeline("pics", source=ImageFolder(root="pics", **{field: 0}), classes=CLASSES)
