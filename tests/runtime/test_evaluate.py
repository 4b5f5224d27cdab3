import json
import math

import numpy as np
import pytest
import torch

from training_runtime.serve.evaluate import evaluate
from training_runtime.models.builtin import build_model
from tests.runtime.helpers import write_split


@pytest.fixture
def known_run(tmp_path):
    """A linear model whose logits equal the features, and a test split with 2 wrong labels."""
    x = np.array([[3, 0, 0, 0], [0, 2, 0, 0], [0, 0, 1, 0], [0, 0, 0, 4],
                  [5, 1, 0, 0], [0, 0, 2, 1], [1, 0, 0, 0], [0, 0, 0, 2]], dtype=np.float32)
    y = np.array([0, 1, 2, 3, 0, 2, 1, 3], dtype=np.int64)  # sample 6 wrong (pred 0)
    y[7] = 2  # sample 7 wrong too (pred 3)
    split = write_split(tmp_path / "data", "test", x, y, per_shard=3)
    manifest = {"format": "model-factory.shards/v1", "feature_shape": [4], "feature_dtype": "float32",
                "label_dtype": "int64", "num_classes": 4, "class_names": ["a", "b", "c", "d"],
                "samples_per_shard": 3, "splits": {"train": split, "test": split}}
    locations = {s["path"]: (tmp_path / "data" / s["path"]).as_uri() for s in split["shards"]}
    out = tmp_path / "out"
    out.mkdir()
    model = build_model("mlp", [4], 4, hidden_sizes=[])
    with torch.no_grad():
        model.net[1].weight.copy_(torch.eye(4))
        model.net[1].bias.zero_()
    torch.save(model.state_dict(), out / "weights.pt")
    (out / "resolved_config.json").write_text(json.dumps(
        {"model": {"name": "mlp", "kwargs": {"hidden_sizes": []}}, "data": {"manifest": manifest},
         "world_size": 2}))
    return out, manifest, locations, x, y


def test_evaluate_known_model(known_run):
    out, manifest, locations, x, y = known_run
    res = evaluate(out, manifest, locations, split="test")
    assert res["num_samples"] == 8
    assert res["accuracy"] == pytest.approx(6 / 8)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    assert res["loss"] == pytest.approx(float(-logp[np.arange(8), y].mean()), rel=1e-6)
    # class a: samples 0, 4 right; b: 1 right, 6 wrong; c: 2, 5 right, 7 wrong; d: 3 right
    assert res["per_class_recall"] == pytest.approx({"a": 1.0, "b": 0.5, "c": 2 / 3, "d": 1.0})
    assert [sum(row) for row in res["confusion_matrix"]] == [2, 2, 3, 1]  # samples per true class
    assert math.isfinite(res["loss"])


def test_evaluate_refuses_a_corrupt_shard_and_missing_split(known_run, tmp_path):
    out, manifest, locations, _, _ = known_run
    path = tmp_path / "data" / manifest["splits"]["test"]["shards"][0]["path"]
    raw = bytearray(path.read_bytes())
    raw[0] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        evaluate(out, manifest, locations, split="test")
    with pytest.raises(RuntimeError, match="no split 'validation'"):
        evaluate(out, manifest, locations, split="validation")


def test_evaluate_requires_a_finished_run(known_run, tmp_path):
    _, manifest, locations, _, _ = known_run
    with pytest.raises(ValueError, match="holds neither model_card.json nor weights.pt"):
        evaluate(tmp_path / "empty", manifest, locations)


# ---------------------------------------------------------------- evaluation by the training job

from training_runtime.serve.evaluate_after_training import (
    EVALUATION_FORMAT,
    evaluation_for_weights,
    evaluation_record,
)

SHA = "ab" * 32


def _record(**changes):
    record = evaluation_record({"test": {"loss": 0.5, "accuracy": 0.75, "num_samples": 8},
                                "validation": {"loss": 0.6, "accuracy": 0.5, "num_samples": 8}},
                               SHA, torch.device("cpu"))
    return {**record, **changes}


def test_the_training_jobs_metrics_are_used_only_for_exactly_these_weights():
    metrics, why = evaluation_for_weights(_record(device="cuda:0"), SHA)
    assert metrics == {"test": {"loss": 0.5, "accuracy": 0.75, "num_samples": 8},
                       "validation": {"loss": 0.6, "accuracy": 0.5, "num_samples": 8}}
    assert why == "evaluated by the training job on cuda:0"
    # No file, other weights (a stale file of an earlier attempt), an unknown format: the step evaluates.
    for record, reason in ((None, "wrote no evaluation.json"),
                           (_record(weights_sha256="cd" * 32), "is of weights cdcd"),
                           (_record(format="model-factory.evaluation/v0"), "of format 'model-factory.evaluation/v0'"),
                           ([1, 2], "of format 'list'")):
        metrics, why = evaluation_for_weights(record, SHA)
        assert metrics is None and reason in why and why.endswith("evaluated here on CPU"), why


def test_a_record_of_these_weights_without_a_split_is_an_error():
    record = _record()
    del record["validation"]
    with pytest.raises(ValueError, match=r"has no metrics for \['validation'\]"):
        evaluation_for_weights(record, SHA)
    with pytest.raises(ValueError, match="needs the metrics of"):
        evaluation_record({"test": {}}, SHA, torch.device("cpu"))
    assert _record()["format"] == EVALUATION_FORMAT


def test_evaluation_config_needs_its_splits(tmp_path):
    from training_runtime.config import ConfigError, RunConfig
    from tests.runtime.helpers import make_config, make_dataset

    manifest, locations = make_dataset(tmp_path, n_train=32, n_test=8, per_shard=16)
    cfg = make_config(tmp_path, manifest, locations)
    assert RunConfig.from_dict(cfg).evaluation.enabled is False
    assert RunConfig.from_dict({**cfg, "evaluation": {"enabled": True}}).evaluation.batch_size == 512
    with pytest.raises(ConfigError, match="evaluation.batch_size must be >= 1"):
        RunConfig.from_dict({**cfg, "evaluation": {"enabled": True, "batch_size": 0}})
    no_test = {**manifest, "splits": {k: v for k, v in manifest["splits"].items() if k != "test"}}
    with pytest.raises(ConfigError, match=r"evaluation.enabled needs the splits .* lacks \['test'\]"):
        RunConfig.from_dict({**cfg, "data": {**cfg["data"], "manifest": no_test}, "evaluation": {"enabled": True}})
    test_shard = manifest["splits"]["test"]["shards"][0]["path"]
    partial = {k: v for k, v in locations.items() if k != test_shard}
    with pytest.raises(ConfigError, match=f"no location for shard '{test_shard}' \\(split 'test'\\)"):
        RunConfig.from_dict({**cfg, "data": {**cfg["data"], "locations": partial}, "evaluation": {"enabled": True}})


@pytest.mark.slow
def test_fsdp_training_evaluates_its_keep_best_weights_as_the_step_would(tmp_path):
    """2 gloo ranks, FSDP, keep_best: rank 0 evaluates the written weights after training; the
    figures equal evaluate()'s, the step's function, on the same weights and shards."""
    from training_runtime.data.shards import sha256_file
    from tests.runtime.helpers import make_config, make_dataset, torchrun

    manifest, locations = make_dataset(tmp_path, n_train=64, n_test=40, per_shard=16)
    cfg = make_config(tmp_path, manifest, locations, sharding="fsdp", epochs=3, batch_size=16)
    cfg["validation"] = {"every_steps": 2, "keep_best": True}
    cfg["evaluation"] = {"enabled": True, "batch_size": 16}
    proc = torchrun(cfg, tmp_path / "run.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "run" / "out"
    record = json.loads((out / "evaluation.json").read_text())
    assert record["weights_sha256"] == sha256_file(out / "model.safetensors")
    assert record["device"] == "cpu"
    for split in ("test", "validation"):
        step = evaluate(out, manifest, locations, split=split, batch_size=16, cache_dir=str(tmp_path / "cache"))
        assert record[split] == json.loads(json.dumps(step)), split
        assert record[split]["num_samples"] == 40
