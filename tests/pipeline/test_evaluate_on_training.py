"""recipe evaluate_on "training": the training job (real torchrun, 2 gloo ranks) evaluates its
weights, commits evaluation.json beside them, and the registered version's metrics are those the
evaluation step itself computes for the same weights."""

from __future__ import annotations

import dataclasses
import json

import pytest

from core.pinned_shards import read_pinned_shards
from core.registry import read_lineage
from core.spec import PipelineDefinitionError, QualityGate
from pipelines.models.digits import digits_pipeline, write_digits_source
from tests.pipeline.conftest import failure_messages


def test_evaluate_on_is_checked_when_definitions_load():
    with pytest.raises(PipelineDefinitionError, match=r"pipeline 'digits', field 'recipe.evaluate_on': 'gpu': use "
                                                      r"'step' .* or 'training'"):
        dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, evaluate_on="gpu"))
    for where in ("step", "training"):
        recipe = dataclasses.replace(digits_pipeline.recipe, evaluate_on=where)
        spec = dataclasses.replace(digits_pipeline, recipe=recipe)
        assert spec.recipe.evaluate_on == where


def test_the_step_reads_the_committed_evaluation_only_for_its_weights(platform):
    from ops.evaluation import training_job_metrics
    from training_runtime.serve.evaluate_after_training import evaluation_record

    store = platform.store()
    store.ensure_repository()
    store.create_branch("run-x")
    folder = "models/toy/checkpoints/x/"
    checkpoint = {"weights_path": folder + "model.safetensors", "commit_id": store.resolve_ref("main")}
    assert training_job_metrics(store, checkpoint, "ab" * 32)[0] is None  # no evaluation.json committed

    metrics = {"test": {"loss": 0.25, "num_samples": 4}, "validation": {"loss": 0.5, "num_samples": 4}}
    record = evaluation_record(metrics, "ab" * 32, "cuda:0")
    store.put_object("run-x", folder + "evaluation.json", json.dumps(record).encode())
    checkpoint["commit_id"] = store.commit("run-x", "train").id
    assert training_job_metrics(store, checkpoint, "ab" * 32) == (metrics, "evaluated by the training job on cuda:0")
    found, why = training_job_metrics(store, checkpoint, "cd" * 32)
    assert found is None and "is of weights abababababab" in why

    store.put_object("run-x", folder + "evaluation.json", b"{not json")
    checkpoint["commit_id"] = store.commit("run-x", "corrupt").id
    with pytest.raises(ValueError, match="evaluation.json at commit .* is not JSON"):
        training_job_metrics(store, checkpoint, "ab" * 32)


@pytest.mark.slow
def test_registered_metrics_are_the_training_jobs_and_equal_the_steps(platform, tmp_path):
    from training_runtime.data.shards import sha256_file
    from training_runtime.serve.evaluate import evaluate
    from training_runtime.serve.card import load_model

    write_digits_source(platform.sources)
    recipe = dataclasses.replace(digits_pipeline.recipe, epochs=1, evaluate_on="training")
    spec = dataclasses.replace(digits_pipeline, recipe=recipe, gate=QualityGate())
    result = platform.run(spec)
    assert result.success, failure_messages(result)

    mats = {e.asset_key.path[-1]: e.materialization for e in result.get_asset_materialization_events()}
    assert mats["model_version"].metadata["evaluated_on"].value == "evaluated by the training job on cpu"
    store = platform.store()
    record = read_lineage(store, "digits")
    ckpt = record["checkpoint"]
    pod = json.loads(store.get_object(ckpt["commit"], ckpt["store_path"].rsplit("/", 1)[0] + "/evaluation.json"))
    assert pod["weights_sha256"] == ckpt["sha256"]

    # What the evaluation step computes (evaluate_checkpoint's call) for the registered weights.
    version = tmp_path / "v1"
    for name in ("model.safetensors", "model_card.json"):
        store.download("main", f"models/digits/versions/v1/{name}", version / name)
    assert sha256_file(version / "model.safetensors") == ckpt["sha256"]
    pinned = read_pinned_shards(store, record["data"]["shards_commit"], record["data"]["manifest_path"])
    loaded = load_model(version)
    for split in ("test", "validation"):
        step = evaluate(version, pinned.manifest, pinned.locations, split=split,
                        s3_endpoint_url=pinned.s3_endpoint_url, loaded=loaded)
        assert record["evaluation"][split] == json.loads(json.dumps(step)), split
        assert pod[split] == record["evaluation"][split], split
