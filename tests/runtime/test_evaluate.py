import json
import math

import numpy as np
import pytest
import torch

from training_runtime.evaluate import evaluate
from training_runtime.models import build_model
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
