"""A table's raw ingest spread over Dagster steps by source files (issue 41, item 4,
assets/table_ingest_steps.py): each group of files parsed, observed and converted alone, then
put together, makes the raw copy, key table, ingest record and report one pass makes, byte for
byte, whatever the grouping; a run ingests in several steps and publishes one commit; a failed
group is retried alone, bad input is not retried, and a re-execution runs only the failed group."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from assets import append, ingest
from assets import table_ingest_steps as steps
from assets.source import SourceChunks
from core.expectations import standard_raw_expectations
from core.spec import QualitySuite, Source, dataset_pipeline
from pipelines.definitions import build_definitions, training_job_name
from pipelines.profiles import Profile
from resources.store.base import StoreError
from resources.store.local import LocalVersionedStore
from tests.pipeline.conftest import Platform, failure_messages

FEATURES = ("f0", "f1", "f2", "f3")
KEY = {"parameters": "p", "code": "c"}


def _suite(spec) -> dict:
    """The standard suite with whole-table expectations (a mean, compound uniqueness) and
    per-row ones, so both kinds are put together across groups."""
    import great_expectations as gx

    suite = standard_raw_expectations(spec, min_rows=10, value_range=(-50, 50))
    suite["rows"] += [gx.expectations.ExpectColumnMeanToBeBetween(column="f0", min_value=-1, max_value=1),
                      gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=list(FEATURES))]
    return suite


def _spec(name: str, pattern: str, task: str = "classification", id_column: str | None = "id",
          files_per_step: int = 16):
    targets = dict(label="y", task="regression") if task == "regression" else dict(label="label", classes=range(3))
    return dataset_pipeline(name, source=Source(paths=(pattern,), chunk_mb=0.002, files_per_step=files_per_step),
                            features=list(FEATURES), id_column=id_column, expectations=QualitySuite(raw=_suite, shards=QualitySuite.standard().shards),
                            split={"seed": 7, "samples_per_shard": 64}, **targets)


def _frame(ids, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ids = list(ids)
    frame = pd.DataFrame(rng.normal(size=(len(ids), 4)).round(4), columns=list(FEATURES))
    frame["label"] = [i % 3 for i in ids]
    frame["y"] = rng.normal(size=len(ids)).round(3)
    frame["id"] = [f"row-{i:05d}" for i in ids]
    frame["note"] = "x"
    return frame


def _write_files(folder: Path, fmt: str, sizes=(130, 70, 1, 160), defects: bool = False) -> list[Path]:
    """Files of the sizes given (rows), ids continuing from file to file: several chunks a file."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for n, size in enumerate(sizes):
        frame = _frame(range(start, start + size), seed=n)
        if defects and n == 3:  # a duplicate of an earlier file's id and row, an out-of-range value
            frame.loc[5, "id"] = "row-00003"
            frame.loc[6, list(FEATURES)] = _frame(range(0, 10), seed=0).loc[2, list(FEATURES)].to_numpy()
            frame.loc[9, "f2"] = 99.0
        path = folder / f"part-{n:02d}.{fmt}"
        frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
        paths.append(path)
        start += size
    return paths


def _single(spec, files: list[Path], out: Path) -> ingest.Ingested:
    out.mkdir(parents=True)
    return append.ingest_source(spec, f"{spec.name}/raw_dataset", spec.expectations.raw(spec),
                                SourceChunks(spec, files, spec.chunk_rows), out / "data.parquet", key=KEY,
                                published=None)


def _in_groups(spec, files: list[Path], per_group: int, out: Path) -> ingest.Ingested:
    out.mkdir(parents=True)
    asset = f"{spec.name}/raw_dataset"
    groups = [steps.ingest_group(spec, asset, spec.expectations.raw(spec), group, out / f"part-{i}.parquet")
              for i, group in enumerate(steps.file_groups(files, per_group))]
    for i in steps.needs_pandas(groups):  # what publish does after a fallback elsewhere
        groups[i] = steps.ingest_group(spec, asset, spec.expectations.raw(spec), files[i * per_group:][:per_group],
                                       out / f"again-{i}.parquet", arrow=False)
    return steps.merge(spec, asset, spec.expectations.raw(spec), groups, out / "data.parquet", key=KEY)


def _same(one: ingest.Ingested, other: ingest.Ingested) -> None:
    assert other.report.to_json() == one.report.to_json()
    assert (other.rows, other.columns, other.reader) == (one.rows, one.columns, one.reader)
    assert json.dumps(other.record, sort_keys=True) == json.dumps(one.record, sort_keys=True)
    if one.report.passed:
        assert other.path.read_bytes() == one.path.read_bytes()
        assert other.keys.read_bytes() == one.keys.read_bytes()


# ---------------------------------------------------------------- groups of files put together, pure


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("task, id_column", [("classification", "id"), ("classification", None),
                                             ("regression", "id"), ("regression", None)])
def test_files_ingested_in_groups_make_the_bytes_of_one_pass(tmp_path, fmt, task, id_column):
    spec = _spec("tab", f"tab/*.{fmt}", task=task, id_column=id_column)
    files = _write_files(tmp_path / "src", fmt)
    one = _single(spec, files, tmp_path / "one")
    assert one.report.passed, one.report.failures
    assert one.record.get("not_appendable") is None and len(one.record["files"]) == 4
    for per_group in (1, 3):
        _same(one, _in_groups(spec, files, per_group, tmp_path / f"groups-{per_group}"))


def test_a_failing_report_and_a_duplicate_id_across_groups_are_those_of_one_pass(tmp_path):
    spec = _spec("tab", "tab/*.csv")
    files = _write_files(tmp_path / "src", "csv", defects=True)
    one = _single(spec, files, tmp_path / "one")
    grouped = _in_groups(spec, files, 1, tmp_path / "groups")
    assert not one.report.passed and any("compound" in f for f in one.report.failures)
    assert any("duplicate id" in f for f in one.report.failures)  # the unique-id rule across two files
    _same(one, grouped)


def test_arrow_falling_back_in_one_group_reads_every_group_with_pandas_as_one_pass_does(tmp_path):
    spec = _spec("tab", "tab/*.csv")
    files = _write_files(tmp_path / "src", "csv")
    frame = pd.read_csv(files[2])
    frame["note"] = "2024-01-02"  # dates: Arrow would not parse them as pandas does
    frame.to_csv(files[2], index=False)
    one = _single(spec, files, tmp_path / "one")
    assert one.reader.startswith("pandas (") and "part-02.csv" in one.reader
    grouped = _in_groups(spec, files, 1, tmp_path / "groups")
    _same(one, grouped)
    assert one.record["not_growable"].startswith("read by pandas (")


def test_groups_join_no_part_for_a_group_without_rows(tmp_path):
    spec = _spec("tab", "tab/*.csv")
    files = _write_files(tmp_path / "src", "csv", sizes=(40, 0, 50))  # a header-only file in the middle
    one = _single(spec, files, tmp_path / "one")
    assert one.report.passed, one.report.failures
    _same(one, _in_groups(spec, files, 1, tmp_path / "groups"))


def test_how_the_files_are_spread_is_not_part_of_the_data_key_and_must_be_a_whole_number():
    import dataclasses

    from assets.data_key import parameters
    from core.spec_fields import PipelineDefinitionError

    spec = _spec("tab", "tab/*.csv")
    assert parameters(dataclasses.replace(spec, source=dataclasses.replace(spec.source, files_per_step=1))) == \
        parameters(spec)
    with pytest.raises(PipelineDefinitionError, match=r"source\.files_per_step.*at least 1"):
        _spec("tab", "tab/*.csv", files_per_step=0)


# ---------------------------------------------------------------- a pipeline's runs


def _ingest_steps(events) -> list[str]:
    return [e.step_key for e in events if e.is_step_success and "_ingest_files[" in e.step_key]


RAW_FILES = ("raw/data.parquet", "raw/keys.parquet", "raw/ingest.json", "raw/sources.json")


def _raw_bytes(store, name: str, ref: str = "main") -> dict[str, bytes]:
    prefix = f"datasets/{name}/"
    return {rel: store.get_object(ref, prefix + rel) for rel in (*RAW_FILES, "validation/raw_dataset.json")}


def _reference(tmp_path: Path, fmt: str = "csv", **kw) -> dict[str, bytes]:
    """What the single step (one group) publishes for the same files."""
    platform = Platform(tmp_path / "reference")
    with platform.instance:
        _write_files(platform.sources / "tab", fmt, **kw)
        result = platform.run(_spec("tab", f"tab/*.{fmt}"))
        assert result.success, failure_messages(result)
        assert len(_ingest_steps(result.all_events)) == 1  # a small source is one step by default
        return _raw_bytes(platform.store(), "tab")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_table_of_files_is_ingested_in_several_steps_and_published_in_one_commit(platform, tmp_path, fmt):
    _write_files(platform.sources / "tab", fmt)
    result = platform.run(_spec("tab", f"tab/*.{fmt}", files_per_step=1))

    assert result.success, failure_messages(result)
    assert len(_ingest_steps(result.all_events)) == 4
    store = platform.store()
    assert _raw_bytes(store, "tab") == _reference(tmp_path, fmt)
    raw_commits = [c for c in store.log(f"run-{result.run_id}") if c.message.startswith("Ingest raw data of tab")]
    assert len(raw_commits) == 1
    assert not store.list_objects("main", prefix="datasets/tab/raw/steps/")  # the staged parts never reach a commit
    said = [e.message for e in platform.instance.all_logs(result.run_id) if "row read" in e.message]
    assert said == ["tab: 4 file(s) to ingest in 4 step(s) of up to 1 (every row read: no published version to "
                    "build on)", "tab: every row read (361): no published version to build on"]


# A job dagster can rebuild by reference: a re-execution from failure needs one.
DATA_ROOT_VAR = "TABLE_INGEST_STEPS_TEST_DATA_ROOT"


def steps_job() -> dg.JobDefinition:
    profile = Profile(name="local", data_root=Path(os.environ[DATA_ROOT_VAR]))
    spec = _spec("tab", "tab/*.csv", files_per_step=1)
    return build_definitions(profile, [spec], with_yaml=False).resolve_job_def(training_job_name(spec))


def _failing_group(monkeypatch, failures: int, error: Exception) -> list[str]:
    """The group of part-01.csv fails its first ``failures`` attempts; returns every group's file
    names as each attempt started."""
    calls: list[str] = []
    failed: list[str] = []  # kept when a test clears ``calls``
    ingest_group = steps.ingest_group

    def fails(spec, asset, suite, files, out, **kw):
        calls.append(files[0].name)
        if files[0].name == "part-01.csv" and len(failed) < failures:
            failed.append(files[0].name)
            raise error
        return ingest_group(spec, asset, suite, files, out, **kw)

    monkeypatch.setattr(steps, "ingest_group", fails)
    return calls


def test_a_failed_group_is_retried_alone(platform, tmp_path, monkeypatch):
    _write_files(platform.sources / "tab", "csv")
    calls = _failing_group(monkeypatch, 1, ValueError("the disk under this step went away"))
    result = platform.run(_spec("tab", "tab/*.csv", files_per_step=1))

    assert result.success, failure_messages(result)
    assert sorted(calls) == ["part-00.csv", "part-01.csv", "part-01.csv", "part-02.csv", "part-03.csv"]
    restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
    assert len(restarted) == 1 and "_ingest_files[files_00001]" in restarted[0]
    assert _raw_bytes(platform.store(), "tab") == _reference(tmp_path)


def test_a_publish_whose_commit_failed_is_retried_and_joins_the_parts_again(platform, tmp_path, monkeypatch):
    """The groups' parts stay staged (on a branch of their own) until the version is committed, so
    a transient failure of the commit is one a retry fixes; their branch goes once it is done."""
    _write_files(platform.sources / "tab", "csv")
    commit, failed = LocalVersionedStore.commit, []

    def fails_once(self, branch, message, *args, **kw):
        if message.startswith("Ingest raw data of tab") and not failed:
            failed.append(branch)
            raise StoreError("the store's commit timed out")
        return commit(self, branch, message, *args, **kw)

    monkeypatch.setattr(LocalVersionedStore, "commit", fails_once)
    result = platform.run(_spec("tab", "tab/*.csv", files_per_step=1))

    assert result.success, failure_messages(result)
    restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
    assert len(failed) == 1 and len(restarted) == 1 and restarted[0].endswith("_publish"), restarted
    store = platform.store()
    assert _raw_bytes(store, "tab") == _reference(tmp_path)
    assert f"run-{result.run_id}{steps.PARTS_SUFFIX}" not in store.list_branches()  # dropped once committed


def test_bad_input_in_a_group_fails_at_once_and_main_is_unchanged(platform, monkeypatch):
    files = _write_files(platform.sources / "tab", "csv")
    files[1].write_bytes(b"")  # an empty file: no retry can fix it
    calls = _failing_group(monkeypatch, 0, ValueError("unused"))
    result = platform.run(_spec("tab", "tab/*.csv", files_per_step=1))

    assert not result.success
    assert "source file 'part-01.csv' is empty (0 bytes)" in failure_messages(result)
    assert calls.count("part-01.csv") == 1  # not retried
    assert not any(e.event_type_value == "STEP_RESTARTED" for e in result.all_events)
    assert not platform.store().list_objects("main", prefix="datasets/tab/")


def test_a_re_execution_from_failure_runs_only_the_failed_group(tmp_path, monkeypatch):
    platform = Platform(tmp_path / "steps")
    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    _write_files(platform.sources / "tab", "csv")
    calls = _failing_group(monkeypatch, 3, ValueError("the disk under this step went away"))  # every retry too
    job = dg.reconstructable(steps_job)
    with platform.instance:
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False) as first:
            assert not first.success
            failed = [e.step_key for e in first.all_events if e.is_step_failure]
            first_id = first.run_id
        store = platform.store()
        assert len(failed) == 1 and "_ingest_files[files_00001]" in failed[0]
        assert not store.list_objects("main", prefix="datasets/tab/")  # nothing published

        calls.clear()
        options = dg.ReexecutionOptions.from_failure(first_id, platform.instance)
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False,
                            reexecution_options=options) as again:
            assert again.success, [e.message for e in again.all_events if e.is_failure]
            ran = [e.step_key for e in again.all_events if e.is_step_success]

        assert calls == ["part-01.csv"] and _ingest_steps(again.all_events) == failed
        assert not any(k.endswith("raw_dataset_plan") for k in ran), ran
        assert _raw_bytes(store, "tab") == _reference(tmp_path)
        assert not store.list_objects("main", prefix="datasets/tab/raw/steps/")
