"""Malformed sources, each run through the real training job on a temporary instance and store.

Every case ends before training, in a failed Great Expectations check or a clear error. After
each: main is unchanged, no model version is registered, main has no staged writes, and when a
check failed, the run branch holds the committed validation report and the commit carries
``check_results``.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from assets.pipeline import RAW_CHECK, SHARDS_CHECK
from assets.quality import standard_raw_expectations, standard_shard_expectations
from core.registry import list_versions
from core.spec import QualitySuite, Source
from pipelines.models import digits as digits_module
from pipelines.models.digits import PIXELS, SOURCE_FILE, digits_pipeline
from tests.pipeline.conftest import Platform, failure_messages

PARQUET = "digits/digits.parquet"
_DIGITS = digits_module.digits_frame()


def digits_frame():
    return _DIGITS.copy()


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory):
    """One instance and store for the catalogue: every case must leave main as it found it anyway."""
    p = Platform(tmp_path_factory.mktemp("catalogue"))
    with p.instance:
        yield p


def _csv(mutate):
    def write(path):
        frame = digits_frame()
        mutate(frame)
        frame.to_csv(path, index=False)
    return write


def _set(row, col, value):
    def mutate(frame):
        frame[col] = frame[col].astype(object)
        frame.loc[row, col] = value
    return _csv(mutate)


def _bytes(data: bytes):
    return lambda path: path.write_bytes(data)


def _text_edit(edit):
    def write(path):
        digits_frame().to_csv(path, index=False)
        path.write_bytes(edit(path.read_bytes()))
    return write


def _duplicate_ids(frame):
    frame.loc[10, "image_id"] = frame.loc[11, "image_id"]


def _starve_class(frame):
    frame.drop(frame.index[frame["label"] == 7][5:], inplace=True)


def _huge_field(path):
    frame = digits_frame()
    frame[PIXELS[3]] = frame[PIXELS[3]].astype(object)
    frame.loc[0, PIXELS[3]] = "x" * 1_000_000
    frame.to_csv(path, index=False)


def _parquet_truncated(path):
    digits_frame().to_parquet(path, index=False)
    path.write_bytes(path.read_bytes()[:2000])


# (case id, writer of the source file, source path, fragment of the failure message, failed check or None)
CASES = [
    ("empty_file", _bytes(b""), SOURCE_FILE, "is empty (0 bytes)", None),
    ("header_only", _bytes((",".join(["image_id", *PIXELS, "label"]) + "\n").encode()), SOURCE_FILE,
     "no rows", RAW_CHECK),
    ("wrong_delimiter", lambda p: digits_frame().to_csv(p, index=False, sep=";"), SOURCE_FILE,
     "lacks column(s)", RAW_CHECK),
    ("missing_column", _csv(lambda f: f.drop(columns=[PIXELS[5]], inplace=True)), SOURCE_FILE,
     "lacks column(s) pixel_5", RAW_CHECK),
    ("changed_type", _csv(lambda f: f.__setitem__(PIXELS[9], "dark")), SOURCE_FILE,
     "non-numeric", RAW_CHECK),
    ("nan_feature", _set(4, PIXELS[20], np.nan), SOURCE_FILE, "expect_column_values_to_not_be_null(value) in pixel_20",
     RAW_CHECK),
    ("infinite_feature", _set(4, PIXELS[21], np.inf), SOURCE_FILE, "NaN or infinite", RAW_CHECK),
    ("unknown_label", _set(3, "label", 11), SOURCE_FILE, "outside the known classes", RAW_CHECK),
    ("missing_label", _set(3, "label", np.nan), SOURCE_FILE, "label column 'label' has missing values",
     RAW_CHECK),
    ("duplicate_ids", _csv(_duplicate_ids), SOURCE_FILE, "duplicate id", RAW_CHECK),
    ("absurd_magnitude", _set(8, PIXELS[30], 1e12), SOURCE_FILE,
     "expect_column_values_to_be_between(value) in pixel_30", RAW_CHECK),
    ("non_utf8_bytes", _text_edit(lambda b: b.replace(b"digit-00007", b"digit-\xff\xfe007", 1)), SOURCE_FILE,
     "cannot be parsed", None),
    ("truncated_file", _text_edit(lambda b: b[: len(b) // 2 + 7]), SOURCE_FILE,
     "expect_column_values_to_not_be_null", RAW_CHECK),
    ("huge_single_field", _huge_field, SOURCE_FILE, "non-numeric", RAW_CHECK),
    ("mixed_types_in_column", _set(slice(0, 40), PIXELS[12], "12px"), SOURCE_FILE,
     "expect_column_values_to_be_in_type_list(value) in pixel_12", RAW_CHECK),
    ("class_starved", _csv(_starve_class), SOURCE_FILE, "share", RAW_CHECK),
    ("zero_byte_parquet", _bytes(b""), PARQUET, "is empty (0 bytes)", None),
    ("truncated_parquet", _parquet_truncated, PARQUET, "cannot be parsed", None),
]


@pytest.mark.parametrize("case, write, source, message, failed_check", CASES, ids=[c[0] for c in CASES])
def test_malformed_source_fails_before_training_and_leaves_main_alone(shared_platform, case, write, source, message,
                                                                      failed_check):
    platform = shared_platform
    spec = dataclasses.replace(digits_pipeline, source=Source(paths=(source,)))
    _write_source(platform, source, write)
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")

    result = platform.run(spec)

    assert not result.success
    assert message in failure_messages(result), failure_messages(result)
    steps = {e.step_key for e in result.all_events if e.is_step_start}
    # the raw asset ran (a graph of steps for a table of files: its plan at least) and failed it
    assert any(s.startswith("digits__raw_dataset.") for s in steps), steps
    assert not [s for s in steps if s.startswith("digits__checkpoint")]  # failed before training
    _assert_main_untouched(store, main_before)
    if failed_check:
        _assert_failed_check_recorded(result, store, failed_check)


def test_extra_columns_are_allowed_and_not_stored_by_default(shared_platform):
    platform = shared_platform
    """Extra source columns pass the gate and are dropped: only declared columns are stored."""
    frame = digits_frame()
    frame["scanner"] = "s1"
    _write_source(platform, SOURCE_FILE, lambda path: frame.to_csv(path, index=False))
    result = platform.run_assets(digits_pipeline, ["raw_dataset"])
    assert result.success, failure_messages(result)
    (check,) = result.get_asset_check_evaluations()
    assert check.passed and check.check_name == RAW_CHECK
    value = result.output_for_node("digits__raw_dataset")
    stored = pd.read_parquet(platform.store().download(
        value["commit_id"], value["path"], platform.root / "raw.parquet"))
    assert "scanner" not in stored.columns and len(stored) == len(frame)


def test_extra_columns_are_refused_when_the_suite_says_so(shared_platform):
    platform = shared_platform
    spec = dataclasses.replace(digits_pipeline, expectations=QualitySuite(
        raw=lambda s: standard_raw_expectations(s, allow_extra_columns=False),
        shards=standard_shard_expectations))
    frame = digits_frame()
    frame["scanner"] = "s1"
    _write_source(platform, SOURCE_FILE, lambda path: frame.to_csv(path, index=False))
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")
    result = platform.run(spec)
    assert not result.success
    assert "expect_table_columns_to_match_set" in failure_messages(result)
    _assert_main_untouched(store, main_before)
    _assert_failed_check_recorded(result, store, RAW_CHECK)


def test_shard_gate_catches_what_a_lax_raw_suite_lets_through(shared_platform):
    platform = shared_platform
    """1e39 is a finite float64 (the raw suite here has no range) but overflows float32 in the shards."""
    lax = QualitySuite(raw=lambda s: {"rows": standard_raw_expectations(s)["rows"][:2]},
                       shards=standard_shard_expectations)
    spec = dataclasses.replace(digits_pipeline, expectations=lax)
    _write_source(platform, SOURCE_FILE, _set(5, PIXELS[40], 1e39))
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")
    result = platform.run(spec)
    assert not result.success
    assert "digits/shards failed" in failure_messages(result)
    _assert_main_untouched(store, main_before)
    _assert_failed_check_recorded(result, store, SHARDS_CHECK)


def _write_source(platform, source: str, write) -> None:
    path = platform.sources / source
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.iterdir():
        old.unlink()
    write(path)


def _assert_main_untouched(store, main_before):
    assert store.resolve_ref("main") == main_before
    assert not store.has_uncommitted_changes("main")
    assert not store.list_objects("main", prefix="datasets/")
    assert list_versions(store, "digits") == []


def _assert_failed_check_recorded(result, store, check_name):
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations[check_name].passed is False
    assert evaluations[check_name].metadata["failed"].value >= 1
    branch = f"run-{result.run_id}"
    asset = "raw_dataset" if check_name == RAW_CHECK else "shards"
    report = json.loads(store.get_object(branch, f"datasets/digits/validation/{asset}.json"))
    assert report["passed"] is False and report["failures"]
    assert not store.has_uncommitted_changes(branch)  # the report is committed, not left staged
    commit_results = json.loads(store.get_commit(branch).metadata["check_results"])
    assert commit_results["passed"] is False
    assert commit_results["failed"] == len(report["failures"])
