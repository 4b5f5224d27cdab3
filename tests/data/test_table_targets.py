"""Tables with regression and multi-label targets: the spec's rules, then the real raw_dataset and
shards assets against a local store (shard format v2, read back as the trainer reads it), the
bundled diabetes dataset, and bad targets refused with the column named while main stays as it was."""

from __future__ import annotations

import io
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from assets.pipeline import SOURCE_COMMIT_TAG
from assets.sharding import assign_splits, build_target_shards_from_chunks
from assets.source import SourceError, validated_arrays
from core.datasets import list_dataset_versions
from core.spec import PipelineDefinitionError, PipelineSpec, Source, dataset_pipeline
from pipelines.cli.render import format_dataset_versions
from pipelines.definitions import build_definitions
from pipelines.models.diabetes import FEATURES as DIABETES_FEATURES
from pipelines.models.diabetes import diabetes_dataset, load_diabetes_frame
from tests.pipeline.conftest import Platform, failure_messages
from training_runtime.data.shard_format import FORMAT_V1, FORMAT_V2
from training_runtime.data.split import open_split

FEATURES = ("f0", "f1", "f2")
LABELS = ("spam", "urgent", "rare_label")
SPLIT = {"seed": 3, "samples_per_shard": 16}


# --- the spec -------------------------------------------------------------------------------------

def _table(**kw) -> PipelineSpec:
    args = dict(name="tab", source=Source(paths=("tab.csv",)), feature_columns=FEATURES, label_column="y",
                task="regression", model=None)
    args.update(kw)
    return PipelineSpec(**args)


@pytest.mark.parametrize("kw, field, says", [
    ({"class_names": ("0", "1")}, "class_names", "a regression target is a number"),
    ({"label_column": ""}, "label_column", "numeric target"),
    ({"label_column": "f1"}, "label_column", "'f1' is also a feature column"),
    ({"id_column": "y"}, "label_column", "'y' is also the id column"),
    ({"label_columns": ("a", "b")}, "label_columns", "applies to task 'multilabel'"),
    ({"target_range": (5, 1)}, "target_range", "low < high"),
    ({"target_range": (0, float("inf"))}, "target_range", "finite"),
    ({"target_range": ("low", "high")}, "target_range", "two numbers"),
    ({"task": "classification", "class_names": ("0", "1"), "target_range": (0, 1)}, "target_range",
     "bounds regression targets"),
    ({"task": "classification", "label_column": "", "class_names": ("0", "1")}, "label_column", "class"),
    ({"task": "language_modeling"}, "task", "TextCorpus"),
    ({"task": "ranking"}, "task", "'ranking' is not a task"),
    ({"task": "multilabel", "label_column": ""}, "label_columns", "give the 0/1 column of each label"),
    ({"task": "multilabel", "label_column": "", "label_columns": ("a", "a")}, "label_columns", "listed twice"),
    ({"task": "multilabel", "label_columns": ("a", "b")}, "label_column", "leave label out"),
    ({"task": "multilabel", "label_column": "", "label_columns": ("a", "f0")}, "label_columns",
     "'f0' is also a feature column"),
    ({"task": "multilabel", "label_column": "", "label_columns": ("a", "b"), "class_names": ("x", "y")},
     "class_names", "are its label columns"),
    ({"task": "multilabel", "label_column": "", "label_columns": ("a", "features")}, "label_columns/id_column",
     "'features' names the raw copy's feature column"),
    ({"task": "multilabel", "label_column": "", "label_columns": ("a", "b"), "id_column": "targets"},
     "id_column", "'targets' names the raw copy's label column"),
])
def test_a_mistaken_target_declaration_names_pipeline_and_field(kw, field, says):
    with pytest.raises(PipelineDefinitionError, match=rf"pipeline 'tab', field '{field}'") as caught:
        _table(**kw)
    assert says in str(caught.value)


def test_the_declaration_functions_take_labels_and_a_target_range():
    regression = dataset_pipeline("reg", source="reg.csv", features=FEATURES, label="y", task="regression",
                                  target_range=[0, 10])
    multilabel = dataset_pipeline("tags", source="tags.csv", features=FEATURES, labels=LABELS, task="multilabel")

    assert regression.target_range == (0.0, 10.0) and regression.class_names == ()
    assert regression.target_columns == ("y",)
    assert multilabel.class_names == LABELS == multilabel.target_columns and multilabel.label_column == ""
    with pytest.raises(PipelineDefinitionError, match="pipeline 'reg', field 'class_names'"):
        dataset_pipeline("reg", source="reg.csv", features=FEATURES, label="y", classes=[0, 1], task="regression")


# --- data -----------------------------------------------------------------------------------------

def regression_frame(n: int = 160, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=[5.0, -2.0, 100.0], scale=[1.0, 3.0, 20.0], size=(n, 3))
    frame = pd.DataFrame(x, columns=list(FEATURES))
    frame["y"] = np.round(50 + 4 * (x[:, 0] - 5) - (x[:, 1] + 2) + rng.normal(scale=2.0, size=n), 3)
    frame.insert(0, "row_id", [f"r-{i:03d}" for i in range(n)])
    return frame


def multilabel_frame(n: int = 160, seed: int = 1) -> pd.DataFrame:
    """0/1 ints for two labels and booleans for the third (pandas and Parquet users bring both)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.normal(size=(n, 3)) * [1.0, 10.0, 0.1] + [0.0, 3.0, -1.0], columns=list(FEATURES))
    frame["spam"] = (frame["f0"] > 0).astype(int)
    frame["urgent"] = (rng.random(n) < 0.3).astype(int)
    frame["rare_label"] = rng.random(n) < 0.2
    frame.insert(0, "row_id", [f"m-{i:03d}" for i in range(n)])
    return frame


def regression_spec(name: str, frame: pd.DataFrame | None = None, **kw) -> PipelineSpec:
    source = (lambda: frame) if frame is not None else Source(paths=(f"{name}/*.csv",))
    return dataset_pipeline(name, source=source, features=FEATURES, label="y", task="regression", id_column="row_id",
                            target_range=(0, 100), split=SPLIT, **kw)


def multilabel_spec(name: str, frame: pd.DataFrame) -> PipelineSpec:
    # a chunk of 26 rows: the raw suite and the raw copy see the source in several pieces
    return dataset_pipeline(name, source=Source(loader=lambda: frame, chunk_mb=0.001), features=FEATURES,
                            labels=LABELS, task="multilabel", id_column="row_id", split=SPLIT)


def upload(store, path: str, frame: pd.DataFrame) -> str:
    """What a user does: commit a source file to main under sources/."""
    store.ensure_repository()
    store.create_branch("upload", "main", exist_ok=True)
    buf = io.BytesIO()
    frame.to_csv(buf, index=False)
    store.put_object("upload", path, buf.getvalue())
    store.commit("upload", "Upload", {"uploaded_by": "test"})
    return store.merge("upload", "main", "Upload")


def read_back(store, dataset: str, into: Path) -> tuple[dict, dict[str, dict]]:
    """The published manifest, and per split the samples by id as ``open_split`` reads them."""
    manifest = json.loads(store.get_object("main", f"datasets/{dataset}/shards/manifest.json"))
    splits = {}
    for split, body in manifest["splits"].items():
        paths = [store.download("main", f"datasets/{dataset}/shards/{e['path']}", into / e["path"])
                 for e in body["shards"]]
        data = open_split(manifest, paths, split)
        batch = data.gather(np.arange(data.num_samples))
        ids = [i.decode() for i in batch["id"]]
        splits[split] = {"ids": ids, "features": batch["features"], "target": batch["target"]}
    return manifest, splits


def sensor_tick(platform, spec: PipelineSpec, cursor: str | None):
    defs = build_definitions(platform.profile, [spec], with_yaml=False)
    sensor = defs.resolve_sensor_def(f"{spec.name}_new_data_sensor")
    with dg.build_sensor_context(instance=platform.instance, cursor=cursor,
                                 resources={"store": platform.profile.resources()["store"]}) as context:
        return sensor.evaluate_tick(context)


def check_features(manifest: dict, splits: dict, source: pd.DataFrame) -> None:
    """Features normalised with the training split's statistics (not all rows'), equal to the source's."""
    by_id = source.set_index("row_id")
    train = by_id.loc[splits["train"]["ids"], list(FEATURES)].to_numpy(np.float32)
    mean, std = train.mean(axis=0, dtype=np.float64), train.std(axis=0, dtype=np.float64)
    norm = manifest["normalisation"]
    np.testing.assert_allclose(norm["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(norm["std"], std, rtol=1e-6)
    everything = by_id[list(FEATURES)].to_numpy(np.float32).mean(axis=0, dtype=np.float64)
    assert not np.allclose(norm["mean"], everything, rtol=1e-6, atol=0)  # the other splits left out
    for split, got in splits.items():
        raw = by_id.loc[got["ids"], list(FEATURES)].to_numpy(np.float32)
        expected = (raw - np.float32(norm["mean"])) / np.float32(norm["std"])
        np.testing.assert_allclose(got["features"], expected, rtol=1e-5, atol=1e-5, err_msg=split)


# --- the platform's rules on a chunk of source rows -------------------------------------------------

def _text_in_y(frame):
    frame["y"] = frame["y"].astype(object)
    frame.loc[4, "y"] = "n/a"


def _missing_and_three(frame):
    frame["spam"] = frame["spam"].astype(float)
    frame.loc[2, "spam"] = np.nan
    frame.loc[6, "urgent"] = 3


@pytest.mark.parametrize("frame_of, spec_of, change, says", [
    (regression_frame, regression_spec, _text_in_y,
     "label column 'y' holds 1 non-numeric value(s), e.g. 'n/a' (id 'r-004'); regression targets must be numbers"),
    (regression_frame, regression_spec, lambda f: f.__setitem__("y", f["y"].replace(f["y"][9], np.inf)),
     "label column 'y' holds 1 missing, NaN or infinite value(s) (id 'r-009')"),
    (multilabel_frame, multilabel_spec, _missing_and_three,
     "label column 'spam' has 1 missing value(s) (id 'm-002'); label column 'urgent' holds 1 value(s) other than "
     "0 and 1, e.g. 3 (id 'm-006')"),
], ids=["text_target", "infinite_target", "missing_and_3_labels"])
def test_the_source_rules_name_the_target_column_and_the_row(frame_of, spec_of, change, says):
    frame = frame_of(20)
    spec = spec_of("bad", frame)
    change(frame)

    with pytest.raises(SourceError) as caught:
        validated_arrays(spec, frame)

    assert says in str(caught.value)


def test_targets_come_out_as_float64_values_or_uint8_rows_of_0_1():
    regression, multilabel = regression_frame(20), multilabel_frame(20)

    _, y, ids = validated_arrays(regression_spec("reg", regression), regression)
    _, labels, _ = validated_arrays(multilabel_spec("tags", multilabel), multilabel)

    assert y.dtype == np.float64 and np.array_equal(y, regression["y"].to_numpy()) and ids[0] == "r-000"
    assert labels.dtype == np.uint8 and np.array_equal(labels, multilabel[list(LABELS)].to_numpy(np.uint8))


def test_target_shards_without_an_id_column_do_not_depend_on_the_row_order(tmp_path):
    frame = multilabel_frame(120)

    def build(rows: np.ndarray, out: Path) -> dict:
        chunks = [(frame.loc[part, list(FEATURES)].to_numpy(np.float32),
                   frame.loc[part, list(LABELS)].to_numpy(np.uint8), None) for part in np.array_split(rows, 3)]
        return build_target_shards_from_chunks(
            chunks, out_dir=out, task="multilabel", feature_columns=FEATURES, target_names=LABELS, id_column=None,
            feature_shape=(3,), seed=1, fractions=(0.8, 0.1, 0.1), samples_per_shard=32)

    ordered = build(np.arange(120), tmp_path / "ordered")
    shuffled = build(np.random.default_rng(0).permutation(120), tmp_path / "shuffled")

    assert ordered == shuffled  # every shard's sha256 included
    assert ordered["split"]["by"] == "row content hash" and ordered["num_classes"] == 3
    assert sum(s["num_samples"] for s in ordered["splits"].values()) == 120


# --- regression and multi-label tables through the assets ------------------------------------------

def test_a_regression_table_lands_through_the_sensor_and_is_sharded_in_format_v2(platform):
    source = regression_frame()
    spec = regression_spec("reg")
    store = platform.store()
    store.ensure_repository()
    cursor = sensor_tick(platform, spec, None).cursor
    head = upload(store, "sources/reg/part-1.csv", source)

    (request,) = sensor_tick(platform, spec, cursor).run_requests
    assert request.tags[SOURCE_COMMIT_TAG] == head
    result = platform.run(spec, tags=request.tags)

    assert result.success, failure_messages(result)
    manifest, splits = read_back(store, "reg", platform.root / "read")
    assert manifest["format"] == FORMAT_V2 and manifest["kind"] == "table" and manifest["task"] == "regression"
    assert manifest["feature_columns"] == list(FEATURES) and manifest["feature_shape"] == [3]
    assert [(c["name"], c["role"], c.get("shape")) for c in manifest["columns"]] == [
        ("features", "input", [3]), ("target", "target", []), ("id", "id", None)]
    assert manifest["target_column"] == "y" and manifest["target_range"] == [0.0, 100.0]
    assert manifest["split"]["by"] == "row_id" and manifest["samples_per_shard"] == 16
    assert sum(len(s["ids"]) for s in splits.values()) == len(source)
    for split, got in splits.items():  # the split is the seeded hash of each id
        codes = assign_splits(pd.Series(got["ids"]), SPLIT["seed"], (0.8, 0.1, 0.1))
        assert (codes == ("train", "validation", "test").index(split)).all() and got["ids"] == sorted(got["ids"])
    by_id = source.set_index("row_id")
    for got in splits.values():  # targets stored raw, in the source's units
        np.testing.assert_array_equal(got["target"], by_id.loc[got["ids"], "y"].to_numpy(np.float32))
    y_train = by_id.loc[splits["train"]["ids"], "y"].to_numpy(np.float32).astype(np.float64)
    assert manifest["target_normalisation"] == pytest.approx({"mean": y_train.mean(), "std": y_train.std()},
                                                             rel=1e-12)
    check_features(manifest, splits, source)
    (version,) = list_dataset_versions(store, "reg")  # what `python -m pipelines datasets reg` lists
    assert version.num_samples == {s: len(got["ids"]) for s, got in splits.items()}
    assert "reg-d1" in format_dataset_versions("reg", [version])


def test_a_multilabel_table_is_sharded_with_a_0_1_vector_per_row(platform):
    source = multilabel_frame()
    spec = multilabel_spec("tags", source)

    result = platform.run(spec)

    assert result.success, failure_messages(result)
    assert spec.chunk_rows < len(source) // 4
    manifest, splits = read_back(platform.store(), "tags", platform.root / "read")
    assert manifest["format"] == FORMAT_V2 and manifest["task"] == "multilabel"
    assert manifest["target_names"] == list(LABELS) and manifest["num_classes"] == 3
    assert "target_normalisation" not in manifest
    assert manifest["columns"][1] == {"name": "target", "kind": "ndarray", "role": "target", "dtype": "float32",
                                      "shape": [3]}
    by_id = source.set_index("row_id")
    for got in splits.values():
        expected = by_id.loc[got["ids"], list(LABELS)].to_numpy(np.float32)
        np.testing.assert_array_equal(got["target"], expected)
    check_features(manifest, splits, source)
    raw = json.loads(platform.store().get_object("main", "datasets/tags/validation/raw_dataset.json"))
    assert raw["passed"] and any(r["table"] == "targets" for r in raw["results"])


def test_a_classification_table_keeps_format_v1_and_lists_its_feature_columns(platform):
    frame = regression_frame(60)
    frame["y"] = np.where(frame["f0"] > 5, "high", "low")
    spec = dataset_pipeline("cls", source=lambda: frame, features=FEATURES, label="y", classes=["high", "low"],
                            id_column="row_id", split=SPLIT)

    result = platform.run(spec)

    assert result.success, failure_messages(result)
    manifest = json.loads(platform.store().get_object("main", "datasets/cls/shards/manifest.json"))
    assert manifest["format"] == FORMAT_V1 and manifest["feature_columns"] == list(FEATURES)
    assert manifest["label_dtype"] == "int64" and "columns" not in manifest and "task" not in manifest
    from training_runtime.config import validate_manifest

    validate_manifest(manifest)  # an extra key old readers ignore


def test_the_diabetes_dataset_materialises_with_the_training_splits_target_statistics(platform):
    source = load_diabetes_frame()

    result = platform.run(diabetes_dataset)

    assert result.success, failure_messages(result)
    assert {(c.check_name, c.passed) for c in result.get_asset_check_evaluations()} == {
        ("raw_expectations", True), ("shard_expectations", True)}
    manifest, splits = read_back(platform.store(), "diabetes", platform.root / "read")
    assert manifest["feature_columns"] == list(DIABETES_FEATURES)
    assert sum(len(s["ids"]) for s in splits.values()) == len(source) == 442
    train_ids = sorted(i for i, code in zip(source["patient_id"], assign_splits(source["patient_id"], 0,
                                                                                (0.8, 0.1, 0.1))) if code == 0)
    assert splits["train"]["ids"] == train_ids
    y = source.set_index("patient_id").loc[train_ids, "target"].to_numpy()
    assert manifest["target_normalisation"] == pytest.approx({"mean": np.mean(y), "std": np.std(y)}, rel=1e-9)
    np.testing.assert_array_equal(splits["train"]["target"], y.astype(np.float32))


# --- bad targets ----------------------------------------------------------------------------------

def _nan_target():
    frame = regression_frame(80)
    frame.loc[7, "y"] = np.nan
    return regression_spec("nan_target", frame)


def _outside_range():
    frame = regression_frame(80)
    frame.loc[11, "y"] = 512.0
    return regression_spec("outside", frame)


def _multilabel_two():
    frame = multilabel_frame(80)
    frame.loc[5, "urgent"] = 2
    return multilabel_spec("label_two", frame)


def _never_in_training():
    frame = multilabel_frame(80)
    codes = assign_splits(frame["row_id"], SPLIT["seed"], (0.8, 0.1, 0.1))
    frame["rare_label"] = codes != 0  # positive only outside the training split
    return multilabel_spec("untrained", frame)


# (case, spec, the asset whose check fails, fragments of the failure message)
CASES = [
    ("nan_target", _nan_target, "raw_dataset",
     ("label column 'y' holds 1 missing, NaN or infinite value(s) (id 'r-007')",
      "rows: expect_column_values_to_not_be_null(y)")),
    ("outside_target_range", _outside_range, "raw_dataset",
     ("label column 'y' holds 1 value(s) outside target_range [0, 100], e.g. 512 (id 'r-011')",
      "rows: expect_column_values_to_be_between(y)")),
    ("multilabel_value_2", _multilabel_two, "raw_dataset",
     ("label column 'urgent' holds 1 value(s) other than 0 and 1, e.g. 2 (id 'm-005')",
      "targets: expect_column_values_to_be_in_set(value) in urgent")),
    ("label_never_in_training", _never_in_training, "shards",
     ("label column(s) ['rare_label'] hold no 1 in the train split",
      "labels: expect_column_values_to_be_between(train_positives) in rare_label")),
]


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory):
    """One instance and store for the catalogue: every case must leave main as it found it anyway."""
    p = Platform(tmp_path_factory.mktemp("targets"))
    with p.instance:
        yield p


@pytest.mark.parametrize("case, make, asset, messages", CASES, ids=[c[0] for c in CASES])
def test_a_bad_target_fails_the_run_names_the_column_and_leaves_main_alone(shared_platform, case, make, asset,
                                                                            messages):
    platform = shared_platform
    spec = make()
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")

    result = platform.run(spec)

    assert not result.success
    text = failure_messages(result)
    assert all(m in text for m in messages), text
    assert store.resolve_ref("main") == main_before and not store.list_objects("main", prefix="datasets/")
    failed = [c for c in result.get_asset_check_evaluations() if not c.passed]
    assert [c.asset_key.path[-1] for c in failed] == [asset]
    branch = f"run-{result.run_id}"
    report = json.loads(store.get_object(branch, f"datasets/{spec.name}/validation/{asset}.json"))
    assert report["passed"] is False and all(any(m in f for f in report["failures"]) for m in messages)
    if asset == "raw_dataset":  # only the evidence stays on the run branch
        assert not store.exists(branch, f"datasets/{spec.name}/raw/data.parquet")


def test_regression_and_multilabel_suites_see_chunks_as_the_whole_frame():
    """The chunked raw suite gives the verdicts of the whole-frame run on the new tables."""
    from assets.quality import raw_tables, run_suite
    from assets.quality.chunked import ChunkedRawSuite

    frame = multilabel_frame(60)
    frame.loc[3, "spam"] = 7
    spec = multilabel_spec("whole", frame)
    whole = run_suite("whole/raw_dataset", spec.expectations.raw(spec),  # a suite's expectations run once
                      raw_tables(FEATURES, "", frame, task="multilabel", label_columns=LABELS))
    chunked = ChunkedRawSuite("whole/raw_dataset", spec.expectations.raw(spec), FEATURES, "", task="multilabel",
                              label_columns=LABELS)
    for start in range(0, len(frame), 13):
        chunked.add(frame.iloc[start:start + 13])

    assert [(o.expectation, o.success) for o in chunked.finish().outcomes] == \
        [(o.expectation, o.success) for o in whole.outcomes]
    assert not whole.passed and any("in spam" in f for f in whole.failures)
