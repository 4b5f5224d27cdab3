"""A table's shards over Dagster steps (issue 41, item 4, assets/table_shard_steps.py): the plan
cuts the parts a whole build cuts from the ids alone and keeps, unread, only parts proven to be
the published ones; each group of parts, sharded alone, makes the files and records a whole
build makes; a run shards in several steps and publishes one commit equal, byte for byte, to the
single-step build; a group that fails is re-executed alone."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from assets import arrow_csv, ingest
from assets import table_shard_steps as steps
from assets.sharding import (
    CARRIED,
    TablePart,
    build_shards,
    build_shards_from_chunks,
    build_target_shards_from_chunks,
    table_manifest,
    v1_header,
    v2_header,
)
from core.datasets import DATA_KEY
from core.spec import Source, dataset_pipeline
from pipelines.definitions import build_definitions, training_job_name
from pipelines.profiles import Profile
from tests.pipeline.conftest import Platform, failure_messages

FEATURES = ("f0", "f1", "f2", "f3")
SPLIT = dict(seed=7, fractions=(0.8, 0.1, 0.1))


def _frame(ids, seed: int = 0) -> pd.DataFrame:
    ids = list(ids)
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame((rng.normal(size=(len(ids), 4)) * [1, 10, 100, 0.1]).round(4).astype(np.float32),
                         columns=list(FEATURES))
    frame["label"] = [str(i % 3) for i in ids]
    frame["id"] = [f"row-{i:06d}" for i in ids]
    return frame


def _v1(frame: pd.DataFrame, out: Path, **kw) -> dict:
    return build_shards(frame, out_dir=out, feature_columns=FEATURES, label_column="label", class_names=("0", "1", "2"),
                        id_column="id", feature_shape=(4,), samples_per_shard=16, **SPLIT, **kw)


# ---------------------------------------------------------------- the plan, pure


def test_the_plan_cuts_from_the_ids_alone_the_parts_a_whole_build_cuts(tmp_path):
    frame = _frame(np.random.default_rng(3).permutation(900))  # rows in no id order
    whole = _v1(frame, tmp_path)
    parts, order, stops = steps.plan_parts(frame["id"].to_numpy(str), target=16, previous=None, salt="", old_rows=0)

    assert [(p["first_id"], p["last_id"], p["rows"]) for p in parts] == \
        [(r["first_id"], r["last_id"], r["rows"]) for r in whole["parts"]]
    assert not any(p["kept"] for p in parts) and len(parts) > 20
    rows, spans = steps.group_rows(order, stops, parts, parts[3:5])
    assert spans == [parts[3]["rows"], parts[4]["rows"]] and list(rows) == sorted(rows)
    ids = sorted(frame["id"].iloc[rows])
    assert ids[0] == parts[3]["first_id"] and ids[-1] == parts[4]["last_id"] and len(ids) == sum(spans)


def test_the_plan_keeps_unread_exactly_the_parts_a_whole_build_finds_unchanged_and_only_when_proven(tmp_path):
    old_ids = np.random.default_rng(4).permutation(np.arange(0, 1800, 2))  # even ids, shuffled
    salt = steps.part_salt({"parameters": "p", "code": "c"})
    first = {**_v1(_frame(old_ids), tmp_path / "v1", salt=salt), DATA_KEY: {"parameters": "p", "code": "c"}}
    new_ids = np.concatenate([old_ids, [7, 501, 1203], np.arange(1800, 1900)])  # some fall inside old parts
    grown = _frame(new_ids)
    grown.iloc[:len(old_ids), :4] = _frame(old_ids).iloc[:, :4].to_numpy()  # the old rows' values, unchanged
    whole = _v1(grown, tmp_path / "v2", salt=salt, previous=first)
    unchanged = {r["key"] for r in whole["parts"]} & {r["key"] for r in first["parts"]}

    def kept(salt=salt, old_rows=len(old_ids), previous=first):
        parts, _, _ = steps.plan_parts(grown["id"].to_numpy(str), target=16, previous=previous, salt=salt,
                                       old_rows=old_rows)
        return {p["kept"] for p in parts if p["kept"]}

    assert 0 < len(unchanged) < len(whole["parts"]) and kept() == unchanged
    assert kept(old_rows=0) == set()  # no proof that the old rows are the published ones: read them
    assert kept(salt="other") == set()  # other parameters or code: every key differs
    assert kept(old_rows=len(old_ids) - 50) < unchanged  # a part holding a row not proven old is read


def test_the_manifest_header_is_the_builders_for_each_task():
    cls = dataset_pipeline("cls", source=Source(paths=("a.csv",)), features=list(FEATURES), label="label",
                           classes=range(3), id_column="id")
    reg = dataset_pipeline("reg", source=Source(paths=("a.csv",)), features=list(FEATURES), label="y",
                           task="regression", target_range=(0, 5))
    assert steps.table_header(cls)["format"] != steps.table_header(reg)["format"]
    assert steps.table_header(cls)["split"]["by"] == "id" and steps.table_header(reg)["target_range"] == [0.0, 5.0]


@pytest.mark.parametrize("task", ["classification", "regression", "multilabel"])
def test_groups_of_parts_sharded_alone_make_the_files_and_manifest_of_a_whole_build(tmp_path, task):
    rng = np.random.default_rng(5)
    n = 700
    ids = np.array([f"r{i:05d}" for i in rng.permutation(n)])
    features = rng.normal(size=(n, 4)).astype(np.float32)
    targets = {"classification": np.array([str(i % 3) for i in range(n)]),
               "regression": rng.normal(size=n) * 3 + 1,
               "multilabel": (rng.random((n, 2)) > 0.5).astype(np.uint8)}[task]
    if task == "classification":
        args = dict(feature_columns=FEATURES, label_column="label", class_names=("0", "1", "2"), id_column="id",
                    feature_shape=(4,), samples_per_shard=24, **SPLIT)
        build, header = build_shards_from_chunks, v1_header(**{k: v for k, v in args.items() if k != "label_column"})
    else:
        names = ("y",) if task == "regression" else ("a", "b")
        args = dict(task=task, feature_columns=FEATURES, target_names=names, id_column="id", feature_shape=(4,),
                    samples_per_shard=24, **SPLIT)
        build, header = build_target_shards_from_chunks, v2_header(**args)
    whole = build([(features, targets, ids)], out_dir=tmp_path / "whole", salt="s", **args)
    parts, order, stops = steps.plan_parts(ids, target=24, previous=None, salt="s", old_rows=0)
    made = []
    for i in range(0, len(parts), 3):  # three parts a group, the rows of each group alone
        rows, spans = steps.group_rows(order, stops, parts, parts[i:i + 3])
        group = build([(features[rows], targets[rows], ids[rows])], out_dir=tmp_path / "steps", salt="s", spans=spans,
                      **args)
        made += [TablePart(r, e) for r, e in zip(group["parts"], steps._entries(group))]

    assert json.dumps(table_manifest(header, made), sort_keys=True) == json.dumps(whole, sort_keys=True)
    for path in (e["path"] for i in whole["splits"].values() for e in i["shards"]):
        assert (tmp_path / "steps" / path).read_bytes() == (tmp_path / "whole" / path).read_bytes()


@pytest.mark.parametrize("value", [0, 2.5])
def test_a_step_size_that_is_not_a_whole_number_of_parts_is_refused_naming_the_field(value):
    from core.spec_fields import PipelineDefinitionError

    with pytest.raises(PipelineDefinitionError, match=r"source\.parts_per_step.*at least 1"):
        dataset_pipeline("tab", source=Source(paths=("a.csv",), parts_per_step=value), features=list(FEATURES),
                         label="label", classes=range(3))


def test_how_the_work_is_spread_is_not_part_of_the_data_key():
    import dataclasses

    from assets.data_key import parameters

    spec = _spec("ledger", "ledger/table.csv")
    wider = dataclasses.replace(spec, source=dataclasses.replace(spec.source, parts_per_step=64))
    assert parameters(wider) == parameters(spec)


def test_a_group_whose_rows_are_not_its_parts_is_refused(tmp_path):
    frame = _frame(range(100))
    with pytest.raises(RuntimeError, match="do not cut 100 row"):
        _v1(frame, tmp_path, spans=[40, 40])


# ---------------------------------------------------------------- a pipeline's runs


def _spec(name: str, path: str, **kw):
    from pipelines.api import dataset_pipeline as declare

    return declare(name, source=Source(paths=(path,), chunk_mb=0.005, parts_per_step=kw.pop("parts_per_step", 3)),
                   features=list(FEATURES), label="label", classes=range(3), id_column="id",
                   split={"seed": 7, "samples_per_shard": 32}, **kw)


def _write(root: Path, rel: str, frame: pd.DataFrame, mode: str = "w") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = frame.assign(label=frame["label"].astype(int))
    with open(path, mode) as f:
        frame.to_csv(f, index=False, header=mode == "w")


def _shard_steps(events) -> list[str]:
    return [e.step_key for e in events if e.is_step_success and "_shard_parts[" in e.step_key]


def _published_equals_a_single_step_build(store, spec, tmp: Path, previous: dict | None = None) -> dict:
    """main's manifest and shards are, byte for byte, what the single step made of the raw copy:
    ``shard_table`` over every row of it."""
    prefix = f"datasets/{spec.name}/shards/"
    published = json.loads(store.get_object("main", prefix + "manifest.json"))
    raw = store.download("main", ingest.raw_path(spec.name), tmp / "raw.parquet")
    single = steps.shard_table(spec, ingest.iter_raw_arrays(spec, raw, spec.chunk_rows), tmp / "single",
                               salt=steps.part_salt(published[DATA_KEY]), previous=previous)
    single = {**single, **{k: published[k] for k in ("source_commit", "location", DATA_KEY)}}
    single["splits"] = {s: {**i, "shards": [{k: v for k, v in e.items() if k != CARRIED} for e in i["shards"]]}
                        for s, i in single["splits"].items()}
    assert json.dumps(published, indent=2, sort_keys=True) == json.dumps(single, indent=2, sort_keys=True)
    for info in single["splits"].values():
        for e in info["shards"]:
            local = tmp / "single" / e["path"]
            if local.exists():  # a kept part's files are the previous version's, compared through their entries
                assert store.get_object("main", prefix + e["path"]) == local.read_bytes(), e["path"]
    return published


@pytest.mark.parametrize("order", ["shuffled", "id order"])
def test_a_table_in_parts_is_sharded_in_several_steps_and_published_in_one_commit(platform, tmp_path, order):
    ids = np.random.default_rng(1).permutation(600) if order == "shuffled" else range(600)
    _write(platform.sources, "ledger/table.csv", _frame(ids))
    spec = _spec("ledger", "ledger/table.csv")
    result = platform.run(spec)

    assert result.success, failure_messages(result)
    store = platform.store()
    manifest = _published_equals_a_single_step_build(store, spec, tmp_path / "check")
    assert len(_shard_steps(result.all_events)) == -(-len(manifest["parts"]) // 3) >= 4
    assert len([c for c in store.log(f"run-{result.run_id}") if c.message.startswith("Shard ledger")]) == 1
    said = [e.message for e in platform.instance.all_logs(result.run_id) if "planned from the raw copy" in e.message]
    size = store.stat_object("main", ingest.raw_path("ledger")).size_bytes
    # A raw copy this small lies within pyarrow's first footer read (64 KiB): the plan reads it once.
    assert said == [f"ledger: 600 row(s) in {len(manifest['parts'])} part(s), planned from the raw copy's id column "
                    f"({size} of the raw copy's {size} byte(s) read in 1 ranged request(s)); 0 kept unread (no "
                    f"published version), {len(manifest['parts'])} to shard in {len(_shard_steps(result.all_events))} "
                    "step(s) of up to 3"]
    read = [re.search(r"from (\d+) of the raw copy's (\d+) row group\(s\) \((\d+) of the raw copy's (\d+) byte",
                      e.message).groups()
            for e in platform.instance.all_logs(result.run_id) if "ranged request(s)), " in e.message]
    assert len(read) == len(_shard_steps(result.all_events)) and all(int(t) > 1 for _, t, _, _ in read)
    assert all(int(b) <= int(s) == size for _, _, b, s in read)
    read = [(n, t) for n, t, _, _ in read]
    if order == "id order":  # a group's rows are a run of the file: it reads only the row groups holding them
        assert all(int(n) < int(t) / 2 for n, t in read), read


@pytest.mark.parametrize("task, id_column", [("regression", None), ("multilabel", "id"), ("classification", None)])
def test_each_task_with_or_without_ids_is_the_single_step_build_over_steps(platform, tmp_path, task, id_column):
    rng = np.random.default_rng(6)
    frame = _frame(rng.permutation(400))
    frame["y"] = rng.normal(size=len(frame)).round(3) * 4
    frame["a"], frame["b"] = rng.integers(0, 2, len(frame)), rng.integers(0, 2, len(frame))
    targets = {"regression": dict(label="y", task="regression"), "multilabel": dict(labels=["a", "b"], task="multilabel"),
               "classification": dict(label="label", classes=["0", "1", "2"])}[task]
    from pipelines.api import dataset_pipeline as declare

    spec = declare("tab", source=Source(loader=lambda: frame, chunk_mb=0.002, parts_per_step=2), features=list(FEATURES),
                   id_column=id_column, split={"seed": 7, "samples_per_shard": 32}, **targets)
    result = platform.run(spec)

    assert result.success, failure_messages(result)
    manifest = _published_equals_a_single_step_build(platform.store(), spec, tmp_path / "check")
    assert len(_shard_steps(result.all_events)) == -(-len(manifest["parts"]) // 2) >= 3
    said = [e.message for e in platform.instance.all_logs(result.run_id) if "planned from the raw copy" in e.message]
    assert ("id column" if id_column else "every column (no id column)") in said[0]


def test_a_small_table_is_one_step_by_default(platform):
    _write(platform.sources, "small/table.csv", _frame(range(300)))
    from pipelines.api import dataset_pipeline as declare

    spec = declare("small", source=Source(paths=("small/table.csv",)), features=list(FEATURES), label="label",
                   classes=range(3), id_column="id", split={"seed": 7, "samples_per_shard": 32})
    result = platform.run(spec)
    assert result.success, failure_messages(result)
    assert spec.source.parts_per_step == 16 and len(_shard_steps(result.all_events)) == 1


def test_an_appended_table_shards_only_the_parts_its_new_rows_fall_in(platform, tmp_path, monkeypatch):
    monkeypatch.setattr(arrow_csv, "PIECE_BYTES", 4096)  # several Arrow pieces, so the file can be appended to
    old = np.random.default_rng(2).permutation(np.arange(0, 1600, 2))
    _write(platform.sources, "ledger/table.csv", _frame(old))
    spec = _spec("ledger", "ledger/table.csv")
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    store = platform.store()
    v1 = json.loads(store.get_object("main", "datasets/ledger/shards/manifest.json"))

    _write(platform.sources, "ledger/table.csv", _frame([5, 901, *range(1600, 1650)], seed=9), mode="a")
    second = platform.run(spec)

    assert second.success, failure_messages(second)
    v2 = _published_equals_a_single_step_build(store, spec, tmp_path / "check", previous=v1)
    kept = {r["key"] for r in v1["parts"]} & {r["key"] for r in v2["parts"]}
    new = len(v2["parts"]) - len(kept)
    assert 0 < new < len(v2["parts"]) // 2 and len(_shard_steps(second.all_events)) == -(-new // 3)
    logs = [e.message for e in platform.instance.all_logs(second.run_id)]
    assert any(f"; {len(kept)} kept unread (its first 800 row(s) are the published version's), {new} to shard" in m
               for m in logs), [m for m in logs if "planned" in m]


# A job dagster can rebuild by reference: a re-execution from failure needs one, and the outputs
# of the first run in the instance's storage, not in memory.
DATA_ROOT_VAR = "TABLE_STEPS_TEST_DATA_ROOT"


def steps_job() -> dg.JobDefinition:
    profile = Profile(name="local", data_root=Path(os.environ[DATA_ROOT_VAR]))
    spec = _spec("ledger", "ledger/table.csv")
    return build_definitions(profile, [spec], with_yaml=False).resolve_job_def(training_job_name(spec))


def test_a_failed_group_is_re_executed_alone_and_the_version_is_one_commit(tmp_path, monkeypatch):
    platform = Platform(tmp_path)
    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    _write(platform.sources, "ledger/table.csv", _frame(np.random.default_rng(1).permutation(500)))
    calls: list[int] = []
    broken: list[int] = []
    shard_rows = steps.shard_rows

    def second_group_fails_once(spec, chunks, out, *, spans, **kw):
        calls.append(len(spans))
        if len(calls) == 2 and not broken:  # a problem no retry fixes: the run fails
            broken.append(len(spans))
            raise ValueError("the disk under this step went away")
        return shard_rows(spec, chunks, out, spans=spans, **kw)

    monkeypatch.setattr(steps, "shard_rows", second_group_fails_once)
    job = dg.reconstructable(steps_job)
    with platform.instance:
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False) as first:
            assert not first.success
            failed = [e.step_key for e in first.all_events if e.is_step_failure]
            first_steps = _shard_steps(first.all_events)
            first_id = first.run_id
        store = platform.store()
        assert len(failed) == 1 and "_shard_parts[" in failed[0]
        assert not store.list_objects("main", prefix="datasets/ledger/shards/")  # nothing published
        assert len(first_steps) >= 3 and len(calls) == len(first_steps) + 1

        calls.clear()
        options = dg.ReexecutionOptions.from_failure(first_id, platform.instance)
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False,
                            reexecution_options=options) as again:
            assert again.success, [e.message for e in again.all_events if e.is_failure]
            ran = [e.step_key for e in again.all_events if e.is_step_success]
            run_id = again.run_id

        # only the failed group (and publish after it) ran again
        assert _shard_steps(again.all_events) == failed and calls == broken
        assert not any(k.endswith("_plan") or k.endswith("raw_dataset") for k in ran), ran
        _published_equals_a_single_step_build(store, _spec("ledger", "ledger/table.csv"), tmp_path / "check")
        assert len([c for c in store.log(f"run-{run_id}") if c.message.startswith("Shard ledger")]) == 1
