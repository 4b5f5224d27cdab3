"""The built-in trainer on every kind of data and task (typed v2 shards), validation with early
stopping and keep_best, and users' own training functions, in-process as a world of one rank."""

import json
from pathlib import Path

import pytest
import torch

from training_runtime.config import ConfigError, RunConfig
from training_runtime.train.context import TrainingContext
from training_runtime.serve.evaluate import evaluate
from training_runtime.serve.card import load_model
from training_runtime.train.trainer import Trainer
from training_runtime.train.user_loop import run_train_fn
from training_runtime.train.best import BestTracker
from tests.runtime import typed_datasets as td

TINY_LM = {"d_model": 32, "nhead": 2, "num_layers": 1, "dim_feedforward": 64}


def _train(d: dict, info) -> tuple[RunConfig, dict]:
    cfg = RunConfig.from_dict(d)
    return cfg, Trainer(cfg, info).run()


def _history_at(metrics: dict, step: int) -> dict:
    return next(h for h in metrics["validation_history"] if h["step"] == step)


@pytest.mark.parametrize("kind", ["images", "jpeg", "lm", "text", "regression", "multilabel"])
def test_each_task_trains_and_its_model_card_reproduces_the_best_validation(tmp_path, world_of_one, kind):
    if kind in ("images", "jpeg"):
        manifest, locations = td.make_images(tmp_path / "data", encoded=kind == "jpeg")
        d = td.config(tmp_path, manifest, locations, kind, model="resnet", model_kwargs={"widths": [8, 16]},
                      task="classification", train={"augment": {"padding": 2, "hflip": True}})
        good = lambda m: m["accuracy"] >= 0.9  # noqa: E731
    elif kind == "lm":
        manifest, locations = td.make_tokens(tmp_path / "data")
        d = td.config(tmp_path, manifest, locations, kind, model="transformer_lm", model_kwargs=TINY_LM,
                      task="language_modeling", train={"lr": 0.005, "epochs": 4})
        good = lambda m: m["perplexity"] < 6  # noqa: E731  (uniform guessing over 12 tokens: 12)
    elif kind == "text":
        manifest, locations = td.make_text_classes(tmp_path / "data")
        d = td.config(tmp_path, manifest, locations, kind, model="text_transformer", model_kwargs=TINY_LM,
                      task="classification", train={"lr": 0.005, "epochs": 4})
        good = lambda m: m["accuracy"] >= 0.9  # noqa: E731
    elif kind == "multilabel":
        manifest, locations = td.make_multilabel(tmp_path / "data")
        d = td.config(tmp_path, manifest, locations, kind, model="mlp", model_kwargs={"hidden_sizes": [32]},
                      task="multilabel", train={"epochs": 8})
        good = lambda m: m["micro_f1"] > 0.85  # noqa: E731
    else:
        manifest, locations = td.make_regression(tmp_path / "data")
        d = td.config(tmp_path, manifest, locations, kind, model="mlp", model_kwargs={"hidden_sizes": [32]},
                      task="regression", train={"epochs": 8})
        good = lambda m: m["r2"] > 0.9  # noqa: E731
    cfg, m = _train(d, world_of_one)
    best = _history_at(m, m["best_step"])
    assert good(best), m["validation_history"]
    values = [h[m["monitor"]] for h in m["validation_history"]]
    assert best[m["monitor"]] == (max(values) if m["monitor_mode"] == "max" else min(values))

    out = Path(cfg.output_dir)
    card = json.loads((out / "model_card.json").read_text())
    assert card["training"]["weights_from_step"] == m["best_step"] and card["task"]["name"] == cfg.task
    assert not (out / "weights.pt").exists() and (out / "model.safetensors").read_bytes()[:8] != b"PK\x03\x04"
    # The files alone give back the model of the best validation: same figures on the same split.
    again = evaluate(out, manifest, locations, split="validation")
    for name in ("loss", m["monitor"]):
        assert again[name] == pytest.approx(best[name], rel=1e-5, abs=1e-6)


def test_early_stopping_stops_where_the_validation_history_says_and_keeps_that_best(tmp_path, world_of_one):
    manifest, locations = td.make_regression(tmp_path / "data")
    # Only an improvement of more than 1e6 counts after the first validation: training must stop
    # at the third validation (patience 2) and keep the weights of the first.
    d = td.config(tmp_path, manifest, locations, "early", model="mlp", model_kwargs={"hidden_sizes": [16]},
                  task="regression", train={"epochs": 20},
                  validation={"every_steps": 3, "metric": "mae", "patience": 2, "min_delta": 1e6})
    cfg, m = _train(d, world_of_one)
    steps = [h["step"] for h in m["validation_history"]]
    assert m["stopped_early"] and steps == [3, 6, 9] and m["steps"] == 9 < m["total_steps"]
    assert m["best_step"] == 3 and m["monitor_mode"] == "min"
    again = evaluate(Path(cfg.output_dir), manifest, locations, split="validation")
    assert again["mae"] == pytest.approx(_history_at(m, 3)["mae"], rel=1e-5)
    # The last checkpoint is the early stop: a rerun resumes there and trains nothing more.
    _, m2 = _train(d, world_of_one)
    assert m2["steps"] == 9 and m2["steps_this_attempt"] == 0 and m2["best_step"] == 3


def test_keep_best_false_writes_the_last_weights(tmp_path, world_of_one):
    manifest, locations = td.make_regression(tmp_path / "data")
    d = td.config(tmp_path, manifest, locations, "last", model="mlp", model_kwargs={"hidden_sizes": [16]},
                  task="regression", train={"epochs": 3}, validation={"every_steps": 4, "keep_best": False})
    cfg, m = _train(d, world_of_one)
    card = json.loads((Path(cfg.output_dir) / "model_card.json").read_text())
    assert card["training"]["weights_from_step"] == m["steps"] == m["total_steps"]


@pytest.mark.parametrize("history, patience, expect_best, expect_stop", [
    ([5.0, 4.0, 4.5, 4.2, 3.0], None, 4, False),
    ([5.0, 4.0, 4.5, 4.2], 2, 1, True),
    ([5.0, 5.0, 5.0], 2, 0, True),  # equal is no improvement
    ([float("nan"), 3.0], None, 1, False),  # a NaN validation is never the best
])
def test_best_tracker(history, patience, expect_best, expect_stop):
    t = BestTracker("loss", "min", patience=patience)
    for step, value in enumerate(history):
        t.observe(step, {"loss": value})
    assert t.best_step == expect_best and t.should_stop == expect_stop
    restored = BestTracker("loss", "min", patience=patience)
    restored.restore(t.state())
    assert restored == t


def test_validation_settings_are_checked(tmp_path):
    manifest, locations = td.make_regression(tmp_path / "data")
    base = dict(model="mlp", model_kwargs={"hidden_sizes": [8]}, task="regression")
    with pytest.raises(ConfigError, match="validation.metric 'accuracy' is not a metric of task 'regression'"):
        RunConfig.from_dict(td.config(tmp_path, manifest, locations, "v", validation={"metric": "accuracy"}, **base))
    with pytest.raises(ConfigError, match="train.augment applies to images"):
        RunConfig.from_dict(td.config(tmp_path, manifest, locations, "v", train={"augment": {"hflip": True}}, **base))
    no_val = {**manifest, "splits": {k: v for k, v in manifest["splits"].items() if k != "validation"}}
    with pytest.raises(ConfigError, match="needs a 'validation' split"):
        RunConfig.from_dict(td.config(tmp_path, no_val, locations, "v", **base))
    with pytest.raises(ConfigError, match="task 'language_modeling'"):
        RunConfig.from_dict(td.config(tmp_path, manifest, locations, "v", model="mlp", model_kwargs={},
                                      task="language_modeling"))


# --- users' training functions ----------------------------------------------------------------------
def _user_config(tmp_path, name: str, fn: str) -> RunConfig:
    manifest, locations = td.make_images(tmp_path / "data", sizes=(48, 16, 16))
    return RunConfig.from_dict(td.config(tmp_path, manifest, locations, name, model="cnn", model_kwargs={"channels": 4},
                                         task="classification", train={"epochs": 2}, train_fn=fn))


def test_a_user_training_function_gets_data_checkpoints_and_reporting(tmp_path, world_of_one):
    cfg = _user_config(tmp_path, "user", "tests.runtime.user_train:main")
    metrics = run_train_fn(TrainingContext(cfg, world_of_one))
    out = Path(cfg.output_dir)
    assert metrics["steps"] == 6 and len(metrics["loss_history"]) == 6 and metrics["train_fn"] == cfg.train_fn
    assert json.loads((out / "metrics.json").read_text())["steps"] == 6
    assert sorted(p.name for p in Path(cfg.checkpoint.dir).glob("step_*")) == ["step_000000004"]
    reported = metrics["reported"][-1]
    assert reported["validation_accuracy"] == pytest.approx(evaluate(out, cfg.data.manifest, cfg.data.locations,
                                                                     split="validation")["accuracy"])
    loaded = load_model(out)
    assert loaded.card["training"]["train_fn"] == cfg.train_fn and isinstance(loaded.model, torch.nn.Module)


@pytest.mark.parametrize("fn, message", [
    ("never_reports", "returned without reporting any figure"),
    ("never_saves_a_model", "returned without saving a model"),
])
def test_a_user_function_that_breaks_the_contract_fails_and_says_so(tmp_path, world_of_one, fn, message):
    cfg = _user_config(tmp_path, fn, f"tests.runtime.user_train:{fn}")
    with pytest.raises(RuntimeError, match=message):
        run_train_fn(TrainingContext(cfg, world_of_one))


@pytest.mark.parametrize("fn, message", [
    ("tests.runtime.user_train:nothing_here", "has no callable 'nothing_here'"),
    ("tests.runtime.no_such_module:main", "cannot import module"),
    ("not a path", "must look like 'package.module:function'"),
])
def test_a_train_fn_that_does_not_import_is_refused_before_training(tmp_path, fn, message):
    with pytest.raises(ConfigError, match=message):
        _user_config(tmp_path, "bad", fn)


def test_a_train_fn_with_the_wrong_signature_is_refused(tmp_path, world_of_one):
    cfg = _user_config(tmp_path, "sig", "tests.runtime.user_train:takes_no_context")
    with pytest.raises(ConfigError, match="must take one argument, the TrainingContext"):
        run_train_fn(TrainingContext(cfg, world_of_one))
