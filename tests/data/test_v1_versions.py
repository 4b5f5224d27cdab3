"""Old model versions made from shard format v1 stay readable and reproducible through the one data path.

``v1_version/`` is a classification version as the platform made it before the v1 loader was
removed: v1 shards from the shards asset's writer (``assets.sharding.build_shards``), the model
the runtime trained on them with the v1 loader (``training_runtime.data.v1.PrefetchLoader``, at
commit d0638fe), and the figures of that training and of its evaluation (``make_version.py``
wrote them all). Today's reader and loader must give the batches the v1 loader gave (its
contract: each batch the sorted indices of the sampler's slice, features and labels read from
the v1 layout), evaluate the old weights to the recorded figures, and retrain to the same model.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.data.v1_version.make_version import train
from training_runtime.data.batches import model_batches, split_loader
from training_runtime.data.info import DataInfo
from training_runtime.data.sampling import epoch_indices, sorted_batches
from training_runtime.data.shards import resolve_shards
from training_runtime.data.split import open_split
from training_runtime.serve.evaluate import evaluate

FIXTURE = Path(__file__).resolve().parent / "v1_version"
RECORDED = json.loads((FIXTURE / "recorded.json").read_text())
CPU = torch.device("cpu")
TOLERANCE = 1e-6  # what `python -m pipelines reproduce` calls the same figure


def _config(work: Path) -> dict:
    text = (FIXTURE / "config.json").read_text().replace("{FIXTURE}", str(FIXTURE)).replace("{WORK}", str(work))
    cfg = json.loads(text)
    # The record predates data.sample_order: it trained in the global order, which reproduce
    # (pipelines/cli/reproduce.py reproduction_config) asks for when a record does not say.
    assert "sample_order" not in cfg["data"]
    cfg["data"]["sample_order"] = "global"
    return cfg


@pytest.fixture(scope="module")
def old():
    cfg = _config(Path("/nonexistent-work-dir"))
    return cfg["data"]["manifest"], cfg["data"]["locations"]


def _v1_arrays(manifest: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's samples straight from the v1 layout: per shard, n x feature_shape float32, then n int64."""
    shape, xs, ys = tuple(manifest["feature_shape"]), [], []
    for entry in manifest["splits"][split]["shards"]:
        raw, n = (FIXTURE / "shards" / entry["path"]).read_bytes(), entry["num_samples"]
        cut = n * math.prod(shape) * 4
        xs.append(np.frombuffer(raw[:cut], "<f4").reshape(n, *shape))
        ys.append(np.frombuffer(raw[cut:], "<i8"))
    return np.concatenate(xs), np.concatenate(ys)


def test_the_fixture_is_what_make_version_recorded(old):
    manifest, _ = old
    assert manifest["format"] == "model-factory.shards/v1"
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            assert entry["sha256"] == RECORDED["shards_sha256"][entry["path"]]
    resolve_shards(manifest, old[1], "train", None)  # sizes and sha256 of the files themselves


@pytest.mark.parametrize("world, workers, start", [(1, 1, 0), (2, 2, 0), (2, 1, 3), (1, 2, 5)])
def test_v1_shards_give_the_v1_loaders_batches(old, world, workers, start):
    """The trainer's path (open_split, split_loader, model_batches) over the old shards, every rank
    and two epochs, against the v1 loader's batches computed from the raw bytes."""
    manifest, locations = old
    info = DataInfo.from_manifest(manifest)
    assert (info.input_column, info.target_column, info.num_classes) == ("features", "label", 3)
    data = open_split(manifest, resolve_shards(manifest, locations, "train", None), "train")
    x, y = _v1_arrays(manifest, "train")
    per_rank_batch = 8 // world
    for epoch in (0, 1):
        for rank in range(world):
            idx = epoch_indices(data.num_samples, world, rank, epoch, seed=0)
            loader = split_loader(data, info, idx, per_rank_batch, start, CPU, epoch=epoch, seed=0,
                                  num_workers=workers, prefetch_batches=2)
            got = list(model_batches(loader, info))
            expected = sorted_batches(idx, per_rank_batch)[start:]
            assert len(got) == len(expected) > 0
            for batch, rows in zip(got, expected, strict=True):
                assert batch["input"].dtype == torch.float32 and batch["target"].dtype == torch.int64
                np.testing.assert_array_equal(batch["input"].numpy(), x[rows])
                np.testing.assert_array_equal(batch["target"].numpy(), y[rows])


def _assert_same_figures(got, recorded, where: str = "") -> None:
    """Equal structure and values, floats within TOLERANCE."""
    if isinstance(recorded, dict):
        assert isinstance(got, dict) and got.keys() == recorded.keys(), where
        for key, want in recorded.items():
            _assert_same_figures(got[key], want, f"{where}.{key}")
    elif isinstance(recorded, list):
        assert isinstance(got, list) and len(got) == len(recorded), where
        for i, (a, b) in enumerate(zip(got, recorded)):
            _assert_same_figures(a, b, f"{where}[{i}]")
    elif isinstance(recorded, float):
        assert math.isclose(got, recorded, rel_tol=0.0, abs_tol=TOLERANCE), (where, got, recorded)
    else:
        assert got == recorded, where


@pytest.mark.parametrize("split", ["test", "validation"])
def test_an_old_version_evaluates_to_its_recorded_figures(old, tmp_path, split):
    manifest, locations = old
    model_dir = shutil.copytree(FIXTURE / "output", tmp_path / "model")
    _assert_same_figures(evaluate(model_dir, manifest, locations, split=split), RECORDED["evaluation"][split])


def test_an_old_version_retrains_to_the_same_model_and_figures(old, tmp_path):
    """``reproduce`` of a version made from v1 shards: the same config through today's runtime."""
    done = train(_config(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "output"
    metrics, original = json.loads((out / "metrics.json").read_text()), json.loads(
        (FIXTURE / "output" / "metrics.json").read_text())
    assert metrics["steps"] == RECORDED["steps"]
    for key in ("loss_history", "validation_history"):
        assert original[key], key
        _assert_same_figures(metrics[key], original[key], key)
    assert metrics["final_loss"] == pytest.approx(RECORDED["final_loss"], rel=0.0, abs=TOLERANCE)
    new, before = load_file(out / "model.safetensors"), load_file(FIXTURE / "output" / "model.safetensors")
    assert new.keys() == before.keys()
    for name in new:
        torch.testing.assert_close(new[name], before[name], rtol=0.0, atol=TOLERANCE)
    manifest, locations = old
    _assert_same_figures(evaluate(out, manifest, locations, split="test"), RECORDED["evaluation"]["test"])
