"""Tasks: losses, metrics (checked against scikit-learn), predictions, cards and lookup, and the
metrics' reduction over a 2-rank gloo group."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from sklearn import metrics as skm
from torch import nn

from training_runtime.data.info import DataInfo
from training_runtime.tasks.names import BUILTIN_TASKS, DEFAULT_MONITOR, TASK_METRICS
from training_runtime.tasks.classification import ClassificationTask
from training_runtime.tasks.language_modeling import LanguageModelingTask
from training_runtime.tasks.multilabel import MultilabelTask
from training_runtime.tasks.regression import RegressionTask
from training_runtime.tasks.base import Task
from training_runtime.tasks.registry import resolve_task, task_from_card

CPU = torch.device("cpu")
CHUNKS = (7, 30, 1, 25)  # update() sizes; the rest of the data goes in one last call


def make_info(**changes) -> DataInfo:
    """A 4-class table dataset; ``changes`` turn it into the data a test needs."""
    base = DataInfo(kind="table", task="classification", input_column="features", input_dtype="float32",
                    input_shape=(3,), encoded=False, target_column="label", target_dtype="int64",
                    target_shape=(), num_classes=4, class_names=("ant", "bee", "cat", "dog"),
                    vocab_size=None, pad_id=None, eos_id=None, normalisation=None,
                    target_normalisation=None)
    return dataclasses.replace(base, **changes)


def regression_info(k: int | None = None, norm: dict | None = None) -> DataInfo:
    return make_info(task="regression", target_column="target", target_dtype="float32",
                     target_shape=() if k is None else (k,), num_classes=None, class_names=(),
                     target_normalisation=norm)


def multilabel_info(k: int = 5) -> DataInfo:
    return make_info(task="multilabel", target_column="target", target_dtype="float32", target_shape=(k,),
                     num_classes=k, class_names=tuple(f"tag{i}" for i in range(k)))


def lm_info(vocab: int | None = 11, window: int = 7, **changes) -> DataInfo:
    return make_info(**{"kind": "text", "task": "language_modeling", "input_column": "tokens",
                        "input_dtype": "int32", "input_shape": (window,), "target_column": None,
                        "target_dtype": None, "num_classes": None, "class_names": (), "vocab_size": vocab,
                        "pad_id": None, "eos_id": 0, **changes})


def feed(metrics, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """Update in calls of CHUNKS sizes (then the rest) and compute."""
    start = 0
    for size in (*CHUNKS, len(targets)):
        stop = min(start + size, len(targets))
        if stop > start:
            metrics.update(outputs[start:stop], targets[start:stop])
        start = stop
    return metrics.compute()


# ---------------------------------------------------------------- seeded data for each task
def classification_data(n: int = 101, num_classes: int = 5, seed: int = 0):
    """Targets from classes 0..3 only and class 4 never predicted: metrics skip or report it as
    scikit-learn does. Logits are noisy one-hots so accuracy is neither 0 nor 1."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, num_classes - 1, (n,), generator=g)
    logits = 2.0 * F.one_hot(targets, num_classes).float() + 1.5 * torch.randn(n, num_classes, generator=g)
    logits[:, -1] = -10.0
    return logits, targets


def binary_data(n: int = 64, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 2, (n,), generator=g)
    logits = F.one_hot(targets, 2).float() + torch.randn(n, 2, generator=g)
    return logits, targets


def regression_data(n: int = 90, k: int | None = None, seed: int = 2):
    """(normalised outputs, raw targets)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n,) if k is None else (n, k)
    normalised = torch.randn(shape, generator=g)
    outputs = normalised + 0.5 * torch.randn(shape, generator=g)
    return outputs, normalised


def multilabel_data(n: int = 90, k: int = 5, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    targets = (torch.rand(n, k, generator=g) < 0.4).float()
    logits = 2.0 * (targets - 0.5) + 1.2 * torch.randn(n, k, generator=g)
    return logits, targets


def lm_data(n: int = 9, window: int = 7, vocab: int = 11, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, window), generator=g)
    logits = torch.randn(n, window - 1, vocab, generator=g)
    logits.scatter_add_(2, tokens[:, 1:, None], torch.full((n, window - 1, 1), 1.5))  # better than chance
    return logits, tokens[:, 1:]


# ---------------------------------------------------------------- classification
def test_classification_metrics_match_sklearn():
    info = make_info(num_classes=5, class_names=("ant", "bee", "cat", "dog", "eel"))
    task = ClassificationTask(info)
    logits, targets = classification_data()
    res = feed(task.new_metrics(CPU), logits, targets)
    y, p = targets.numpy(), logits.argmax(1).numpy()
    probs = torch.softmax(logits.double(), 1).numpy()
    assert 0.3 < res["accuracy"] < 0.95
    assert res["accuracy"] == pytest.approx(skm.accuracy_score(y, p))
    assert res["macro_f1"] == pytest.approx(skm.f1_score(y, p, average="macro"))
    assert res["loss"] == pytest.approx(skm.log_loss(y, probs, labels=range(5)), rel=1e-6)
    present = sorted(set(y))
    recall = skm.recall_score(y, p, labels=present, average=None)
    assert res["per_class_recall"] == pytest.approx({info.class_names[c]: r for c, r in zip(present, recall)})
    assert "eel" not in res["per_class_recall"]  # no samples in the split: no recall
    assert res["confusion_matrix"] == skm.confusion_matrix(y, p, labels=range(5)).tolist()
    assert res["num_samples"] == len(y)
    assert "auroc" not in res  # five classes
    assert all(isinstance(res[m], float) for m in task.metric_names)


def test_binary_classification_reports_auroc():
    task = ClassificationTask(make_info(num_classes=2, class_names=()))
    logits, targets = binary_data()
    res = feed(task.new_metrics(CPU), logits, targets)
    probs = torch.softmax(logits, 1)[:, 1].numpy()
    assert res["auroc"] == pytest.approx(skm.roc_auc_score(targets.numpy(), probs))
    assert set(res["per_class_recall"]) == {"0", "1"}  # names default to the class indices


def test_classification_forward_loss_predict():
    task = ClassificationTask(make_info())
    model = nn.Linear(3, 4)
    batch = {"input": torch.randn(6, 3), "target": torch.tensor([0, 1, 2, 3, 0, 1], dtype=torch.int32)}
    outputs, targets = task.forward(model, batch)
    assert targets.dtype == torch.int64 and task.num_outputs() == 4
    loss = task.loss(outputs.bfloat16(), targets)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    pred = task.predict(outputs)
    assert pred["class_index"].dtype == np.int64 and pred["probabilities"].dtype == np.float32
    np.testing.assert_array_equal(pred["class_index"], outputs.argmax(1).numpy())
    np.testing.assert_allclose(pred["probabilities"].sum(1), 1.0, rtol=1e-6)


def test_reset_starts_over_and_empty_compute_raises():
    task = ClassificationTask(make_info(num_classes=5, class_names=()))
    metrics = task.new_metrics(CPU)
    logits, targets = classification_data()
    feed(metrics, logits, targets)
    metrics.reset()
    with pytest.raises(ValueError, match="no samples"), pytest.warns(UserWarning):
        metrics.compute()
    assert feed(metrics, logits[:10], targets[:10])["num_samples"] == 10


# ---------------------------------------------------------------- regression
def test_regression_metrics_and_predictions_in_original_units():
    norm = {"mean": 50.0, "std": 10.0}
    task = RegressionTask(regression_info(norm=norm))
    outputs, normalised = regression_data()
    raw = normalised * 10 + 50
    model = nn.Linear(3, 1)
    x = torch.randn(len(raw), 3)
    model_out, targets = task.forward(model, {"input": x, "target": raw})
    assert model_out.shape == (len(raw),) and task.num_outputs() == 1
    torch.testing.assert_close(targets, normalised)
    assert task.loss(model_out, targets).item() == pytest.approx(F.mse_loss(model(x).squeeze(1), normalised).item())

    res = feed(task.new_metrics(CPU), outputs, targets)
    pred = (outputs * 10 + 50).double().numpy()
    y = raw.double().numpy()
    assert res["mse"] == pytest.approx(skm.mean_squared_error(y, pred), rel=1e-5)
    assert res["mae"] == pytest.approx(skm.mean_absolute_error(y, pred), rel=1e-5)
    assert res["r2"] == pytest.approx(skm.r2_score(y, pred), rel=1e-5)
    assert res["loss"] == pytest.approx(res["mse"] / 100, rel=1e-5)  # trained in normalised units
    value = task.predict(outputs[:, None])["value"]  # the model's [N, 1] output, as ONNX gives it
    assert value.shape == (len(y),) and value.dtype == np.float64  # the card's float64 postprocessing
    np.testing.assert_allclose(value, pred, rtol=1e-6)


def test_vector_regression_far_from_zero():
    """Per-target statistics; targets around 1e5 keep R2 accurate (no sum-of-squares cancellation)."""
    norm = {"mean": [1e5, -3.0], "std": [3.0, 0.5]}
    task = RegressionTask(regression_info(k=2, norm=norm))
    outputs, normalised = regression_data(k=2)
    mean, std = torch.tensor(norm["mean"], dtype=torch.float64), torch.tensor(norm["std"], dtype=torch.float64)
    raw = normalised.double() * std + mean
    _, targets = task.forward(lambda x: x, {"input": outputs, "target": raw.float()})
    res = feed(task.new_metrics(CPU), outputs, targets)
    pred = (outputs.double() * std + mean).numpy()
    assert res["mse"] == pytest.approx(skm.mean_squared_error(raw.numpy(), pred), rel=1e-4)
    assert res["mae"] == pytest.approx(skm.mean_absolute_error(raw.numpy(), pred), rel=1e-4)
    assert res["r2"] == pytest.approx(skm.r2_score(raw.numpy(), pred), rel=1e-4)
    np.testing.assert_allclose(task.predict(outputs)["value"], pred, rtol=1e-6)


def test_regression_without_normalisation_is_identity_and_checks_shapes():
    task = RegressionTask(regression_info())
    outputs, targets = regression_data()
    res = feed(task.new_metrics(CPU), outputs, targets)
    assert res["mse"] == pytest.approx(res["loss"])
    assert res["mse"] == pytest.approx(skm.mean_squared_error(targets.numpy(), outputs.numpy()), rel=1e-5)
    with pytest.raises(ValueError, match=r"output shape \(4, 2\).*num_classes=1"):
        task.forward(nn.Linear(3, 2), {"input": torch.randn(4, 3), "target": torch.randn(4)})


# ---------------------------------------------------------------- multi-label
def test_multilabel_metrics_match_sklearn():
    task = MultilabelTask(multilabel_info())
    logits, targets = multilabel_data()
    res = feed(task.new_metrics(CPU), logits, targets)
    pred = task.predict(logits)
    labels = pred["labels"]
    np.testing.assert_array_equal(labels, (torch.sigmoid(logits) > 0.5).long().numpy())
    assert labels.dtype == np.int64 and pred["probabilities"].dtype == np.float32
    y = targets.long().numpy()
    assert 0.05 < res["subset_accuracy"] < 0.95
    assert res["subset_accuracy"] == pytest.approx(skm.accuracy_score(y, labels))
    assert res["micro_f1"] == pytest.approx(skm.f1_score(y, labels, average="micro"))
    assert res["macro_f1"] == pytest.approx(skm.f1_score(y, labels, average="macro"))
    per_label = skm.f1_score(y, labels, average=None)
    assert res["per_label_f1"] == pytest.approx(dict(zip(task.label_names, per_label)))
    assert res["loss"] == pytest.approx(F.binary_cross_entropy_with_logits(logits, targets).item(), rel=1e-6)


def test_multilabel_threshold_comes_from_the_card():
    info = multilabel_info()
    task = MultilabelTask(info, threshold=0.8)
    card = json.loads(json.dumps(task.card()))
    again = task_from_card(card, info)
    logits, _ = multilabel_data()
    assert card["threshold"] == 0.8 and isinstance(again, MultilabelTask)
    np.testing.assert_array_equal(again.predict(logits)["labels"], (torch.sigmoid(logits) > 0.8).numpy())


# ---------------------------------------------------------------- language modelling
def test_language_modeling_forward_loss_and_perplexity():
    info = lm_info()
    task = LanguageModelingTask(info)
    assert task.num_outputs() == 11
    tokens = torch.randint(0, 11, (4, 7), generator=torch.Generator().manual_seed(5))
    model = nn.Embedding(11, 11)
    outputs, targets = task.forward(model, {"input": tokens})
    assert outputs.shape == (4, 6, 11)
    torch.testing.assert_close(outputs, model(tokens[:, :-1]))
    torch.testing.assert_close(targets, tokens[:, 1:])

    logits, targets = lm_data()
    res = feed(task.new_metrics(CPU), logits, targets)
    # Token-weighted by hand: every token's CE, summed, over the number of tokens.
    token_ce = -torch.log_softmax(logits.double(), -1).gather(2, targets[..., None]).squeeze(-1)
    assert res["num_tokens"] == targets.numel()
    assert res["loss"] == pytest.approx(float(token_ce.mean()), rel=1e-6)
    assert res["perplexity"] == pytest.approx(math.exp(float(token_ce.sum()) / targets.numel()), rel=1e-6)
    per_batch = [math.exp(float(c.mean())) for c in token_ce.split([7, 2])]
    assert res["perplexity"] != pytest.approx(sum(per_batch) / 2, rel=1e-3)  # not a mean of batch perplexities
    assert res["accuracy"] == pytest.approx(float((logits.argmax(-1) == targets).double().mean()))
    assert task.loss(logits.bfloat16(), targets).dtype == torch.float32
    assert task.loss(logits, targets).item() == pytest.approx(res["loss"], rel=1e-5)

    probs = task.predict(logits)["next_token_probabilities"]
    assert probs.shape == (9, 11) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, torch.softmax(logits[:, -1], -1).numpy(), rtol=1e-6)


# ---------------------------------------------------------------- names, cards, lookup
def test_builtin_classes_match_the_torch_free_tables():
    infos = {"classification": make_info(), "regression": regression_info(),
             "multilabel": multilabel_info(), "language_modeling": lm_info()}
    for name in BUILTIN_TASKS:
        task = resolve_task(name, infos[name])
        assert type(task).name == name
        assert task.metric_names == TASK_METRICS[name] and task.monitor == DEFAULT_MONITOR[name]
        card = json.loads(json.dumps(task.card()))  # JSON-ready
        assert card["name"] == name and "import_path" not in card
        assert type(task_from_card(card, infos[name])) is type(task)


def test_regression_card_keeps_the_training_normalisation():
    task = RegressionTask(regression_info(k=2, norm={"mean": [1.0, 2.0], "std": 4.0}))
    card = json.loads(json.dumps(task.card()))
    assert card["target_normalisation"] == {"mean": [1.0, 2.0], "std": [4.0, 4.0]}
    served = task_from_card(card, regression_info(k=2))  # serving's manifest lacks the statistics
    np.testing.assert_allclose(served.predict(torch.ones(1, 2))["value"], [[5.0, 6.0]])


def test_resolve_custom_task_by_import_path():
    info = regression_info()
    task = resolve_task("tests.runtime.user_task:L1Regression", info)
    assert task.name == "l1_regression" and task.num_outputs() == 1
    outputs, targets = regression_data()
    res = feed(task.new_metrics(CPU), outputs, targets)
    assert res["mae"] == pytest.approx(skm.mean_absolute_error(targets.numpy(), outputs.numpy()), rel=1e-5)
    card = task.card()
    assert card["import_path"] == "tests.runtime.user_task:L1Regression"
    assert type(task_from_card(card, info)) is type(task)


@pytest.mark.parametrize("name, info, pattern", [
    ("ranking", make_info(), r"task 'ranking' is unknown; use one of .*package\.module:ClassName"),
    ("tests.runtime.no_such_module:Task", make_info(), r"task '.*no_such_module:Task' cannot be imported"),
    ("tests.runtime.user_task:Missing", make_info(), r"cannot be imported .*Missing"),
    ("tests.runtime.user_task:NotATask", make_info(), r"is a class NotATask, not a Task subclass"),
    ("tests.runtime.user_task:LossNotFirst", regression_info(), r"metric_names must be .* starting with 'loss'"),
    ("tests.runtime.user_task:Unfinished", make_info(), r"leaves Task methods \[.*'forward'.*\] unimplemented"),
    ("regression", make_info(), r"task 'regression' does not fit the data: regression needs a float target"
                                r".*int64.*task 'classification'.*set task to 'classification'"),
    ("language_modeling", lm_info(vocab=None), r"task 'language_modeling' does not fit the data: .*vocab_size"
                                               r".*prepare the data again"),
    ("language_modeling", lm_info(task="classification", target_column="label", target_dtype="int64"),
     r"target column 'label'.*set task to 'classification'"),
    ("classification", regression_info(), r"needs one integer class label.*float32"),
    ("classification", make_info(num_classes=4, class_names=("a", "b")), r"2 class_names for 4 outputs"),
    ("multilabel", make_info(), r"0/1 vector of k labels"),
    ("regression", regression_info(k=2, norm={"mean": [0.0, 1.0], "std": [1.0, 0.0]}), r"stds > 0"),
    ("regression", regression_info(k=2, norm={"mean": [0.0, 1.0, 2.0], "std": 1.0}), r"list of 2 numbers"),
    ("tests.runtime.user_task:L1Regression", make_info(), r"l1_regression needs a float32 scalar target"),
])
def test_resolve_task_errors(name, info, pattern):
    with pytest.raises(ValueError, match=pattern):
        resolve_task(name, info)


def test_task_base_class_is_abstract():
    with pytest.raises(TypeError):
        Task(make_info())  # type: ignore[abstract]


# ---------------------------------------------------------------- two gloo ranks
def _all_cases():
    """(task, outputs, targets) for every built-in, binary classification included."""
    return {
        "classification": (ClassificationTask(make_info(num_classes=5, class_names=())), *classification_data()),
        "binary": (ClassificationTask(make_info(num_classes=2, class_names=())), *binary_data()),
        "regression": (RegressionTask(regression_info(k=2, norm={"mean": [3.0, -1.0], "std": [2.0, 0.5]})),
                       *regression_data(k=2)),
        "multilabel": (MultilabelTask(multilabel_info()), *multilabel_data()),
        "language_modeling": (LanguageModelingTask(lm_info()), *lm_data()),
    }


RANKS_TIMEOUT_S = 150  # each rank imports torch afresh: slow on a busy machine, never minutes


def _rank_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results: dict[str, dict] = {"uneven": {}, "rank1_empty": {}}
        for case, (task, outputs, targets) in _all_cases().items():
            # Uneven shares (rank 0 has more), and everything on rank 0 (a split smaller than the
            # world): the empty rank still takes part in compute()'s reduction.
            for layout, cut in (("uneven", (len(targets) * 3) // 5), ("rank1_empty", len(targets))):
                part = slice(0, cut) if rank == 0 else slice(cut, None)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torchmetrics: compute() before update() on rank 1
                    results[layout][case] = feed(task.new_metrics(CPU), outputs[part], targets[part])
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _assert_same(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == pytest.approx(b, rel=1e-6), where


@pytest.mark.slow  # two fresh processes import torch
def test_two_gloo_ranks_compute_the_metrics_of_all_the_data(tmp_path):
    assert not dist.is_initialized()  # one process on all the data: nothing to reduce
    expected = {case: feed(task.new_metrics(CPU), outputs, targets)
                for case, (task, outputs, targets) in _all_cases().items()}
    assert "auroc" in expected["binary"]
    # spawn, not fork: a forked child deadlocks in GNU OpenMP once the parent has run a parallel op.
    ranks = mp.start_processes(_rank_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2,
                               join=False, start_method="spawn")
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not ranks.join(timeout=1):  # raises when a rank fails
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            pytest.fail(f"the two ranks did not finish in {RANKS_TIMEOUT_S} s")
    expected = json.loads(json.dumps(expected))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for layout in ("uneven", "rank1_empty"):
            _assert_same(got[layout], expected, f"rank{rank}/{layout}")
