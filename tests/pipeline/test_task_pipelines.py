"""The shipped non-classification pipelines end to end (real Dagster runs, real torchrun with 2
gloo ranks, small recipes): each registers a version whose files alone give back its figures
through ``load_model`` and ``predict``, with an ONNX export checked against PyTorch, and which
``reproduce --exact`` trains again to the same bytes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from core.pinned_shards import read_pinned_shards
from core.registry import read_lineage, version_prefix, version_tag
from core.spec import QualityGate
from pipelines.cli.compare import compare_rows
from pipelines.models.denoising import digits_denoiser
from pipelines.models.diabetes import FEATURES, ID_COLUMN, TARGET, diabetes_dataset, diabetes_mlp, load_diabetes_frame
from pipelines.models.digits import digits_pipeline, write_digits_source
from pipelines.models.pydoc_corpus import pydoc_corpus, pydoc_lm, write_pydoc_source
from pipelines.serving import load_model, predict
from tests.pipeline.conftest import failure_messages
from tests.pipeline.reproduction import assert_reproduced_exactly
from training_runtime.data.shards import resolve_shards
from training_runtime.data.split import open_split

pytestmark = pytest.mark.slow


def _recipe(spec, **changes):
    return dataclasses.replace(spec, recipe=dataclasses.replace(spec.recipe, **changes))


def _version_files(store, model: str, version: int = 1) -> set[str]:
    prefix = version_prefix(model, version)
    return {o.path[len(prefix):] for o in store.list_objects(version_tag(model, version), prefix=prefix)}


def _onnx_checked(record: dict) -> None:
    onnx = record["serving"]["onnx"]
    assert onnx["ok"] and onnx["passed"] and onnx["max_abs_diff"] <= onnx["tolerance"], onnx


def test_regression_version_serves_its_own_test_figures_from_the_card_alone(platform, tmp_path):
    model = _recipe(diabetes_mlp, epochs=12)
    first = platform.run(diabetes_dataset, specs=[diabetes_dataset, model])
    assert first.success, failure_messages(first)
    store = platform.store()
    record = read_lineage(store, "diabetes_mlp")
    test = record["evaluation"]["test"]
    assert record["task"] == "regression" and {"mse", "mae", "r2"} <= set(test) and "accuracy" not in test
    assert record["quality_gate"]["bounds"] == {"test_r2": {"min": 0.3}} and test["r2"] >= 0.3
    assert {"model.safetensors", "model_card.json", "model.onnx", "lineage.json"} <= _version_files(store, "diabetes_mlp")
    _onnx_checked(record)

    # The test split's rows, as a user would hand them over: the source's columns, in source units.
    pinned = read_pinned_shards(store, record["data"]["shards_commit"], record["data"]["manifest_path"])
    paths = resolve_shards(pinned.manifest, pinned.locations, "test", str(tmp_path / "cache"), verify=True)
    ids = [i.decode() if isinstance(i, bytes) else i
           for i in open_split(pinned.manifest, paths, "test").gather(np.arange(test["num_samples"]), ["id"])["id"]]
    rows = load_diabetes_frame().set_index(ID_COLUMN).loc[ids]
    csv = tmp_path / "patients.csv"
    rows[list(FEATURES)].to_csv(csv, index=False)

    loaded = load_model("diabetes_mlp", store=store)
    predicted = np.array([p["value"] for p in predict(loaded, str(csv))])
    truth = rows[TARGET].to_numpy()
    # Served predictions give the registered figures, and these agree with scikit-learn's.
    assert r2_score(truth, predicted) == pytest.approx(test["r2"], abs=1e-4)
    assert mean_squared_error(truth, predicted) == pytest.approx(test["mse"], rel=1e-4)
    assert mean_absolute_error(truth, predicted) == pytest.approx(test["mae"], rel=1e-4)

    # compare and diff show the regression figures (tests/cli compares two versions' rows)
    rows_ = {(s, f): v for s, f, v, _ in compare_rows([record])}
    assert rows_[("metrics", "test r2")] == [test["r2"]] and rows_[("metrics", "test mae")] == [test["mae"]]

    # reproduce retrains it from the lineage record alone: the same figures, the same bytes.
    assert_reproduced_exactly(platform, "diabetes_mlp", "test r2")


def test_language_model_version_records_perplexity_samples_and_serves_text(platform):
    write_pydoc_source(platform.sources)
    model = dataclasses.replace(_recipe(pydoc_lm, epochs=1), gate=QualityGate(bounds={"test_perplexity": {"max": 2500}}))
    result = platform.run(pydoc_corpus, specs=[pydoc_corpus, model])
    assert result.success, failure_messages(result)
    store = platform.store()
    record = read_lineage(store, "pydoc_lm")
    test = record["evaluation"]["test"]
    assert record["task"] == "language_modeling"
    assert test["perplexity"] == pytest.approx(math.exp(test["loss"]), rel=1e-6) and test["perplexity"] < 2048
    samples = record["serving"]["continuations"]
    assert len(samples) == 3 and all(s["prompt"] and s["continuation"] for s in samples)
    assert {"model.safetensors", "model_card.json", "tokenizer.json"} <= _version_files(store, "pydoc_lm")
    _onnx_checked(record)
    mats = {e.asset_key.path[0]: e.materialization.metadata for e in result.get_asset_materialization_events()
            if e.asset_key.path[-1] == "model_version"}
    assert "sampled_continuations" in mats["pydoc_lm"]

    loaded = load_model("pydoc_lm", store=store)
    out = predict(loaded, "The assert statement", max_new_tokens=12, seed=3)
    again = predict(loaded, "The assert statement", max_new_tokens=12, seed=3)
    assert out == again and out[0]["prompt"] == "The assert statement" and out[0]["continuation"]

    # reproduce retrains it from the lineage record alone (its tokenizer beside the shards):
    # the same figures, the same bytes.
    assert_reproduced_exactly(platform, "pydoc_lm", "test perplexity")


def test_a_pipeline_with_its_own_training_loop_and_task_registers_by_its_own_metric(platform):
    write_digits_source(platform.sources)
    data = dataclasses.replace(digits_pipeline, model=None)  # the digits data alone: only the denoiser trains
    denoiser = _recipe(digits_denoiser, epochs=3)
    result = platform.run(data, specs=[data, denoiser])
    assert result.success, failure_messages(result)
    record = read_lineage(platform.store(), "digits_denoiser")
    test = record["evaluation"]["test"]
    assert record["task"] == digits_denoiser.task and test["reconstruction_mse"] <= 0.6
    assert record["training"]["config"]["train_fn"] == digits_denoiser.train
    reported = record["training_figures"]
    assert reported["steps"] == record["training"]["config"]["total_steps"]
    _onnx_checked(record)
