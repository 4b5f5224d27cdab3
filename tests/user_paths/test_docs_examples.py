"""docs/own-training-code.md against the code: "The TrainingContext" names every public member of
the class and nothing it lacks; the "Your own Task" example (tests/user_paths/team_package/task.py,
which tests/docs holds the page's block to) passes the registry's checks, learns, evaluates and
serves. The user-path matrix trains it end to end in a team location."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training_runtime.train.context import TrainingContext

PAGE = Path(__file__).resolve().parents[2] / "docs" / "own-training-code.md"
TASK = "tests.user_paths.team_package.task:SmoothedClassification"


def section(heading: str) -> str:
    text = PAGE.read_text()
    found = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert found, f"{PAGE} has no section {heading!r}"
    return found.group(1)


def public_members(cls: type) -> set[str]:
    """Methods and properties of the class, and the attributes its __init__ sets, without a leading '_'."""
    members = {n for n in vars(cls) if not n.startswith("_")}
    tree = ast.parse(inspect.getsource(cls))
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    members |= {t.attr for t in ast.walk(init) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                and isinstance(t.value, ast.Name) and t.value.id == "self" and not t.attr.startswith("_")}
    return members


def documented_members(text: str) -> set[str]:
    """The names in the first column of the section's tables: `name`, `name(args)`, several per cell."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= {m.group(1) for m in re.finditer(r"`([A-Za-z_]\w*)", first)}
    return names


def test_the_training_context_reference_names_every_public_member_and_no_other():
    documented = documented_members(section("The TrainingContext"))
    actual = public_members(TrainingContext)
    assert sorted(actual - documented) == [], "members of TrainingContext the page leaves out"
    assert sorted(documented - actual) == [], "names the page documents that TrainingContext lacks"
    for name in ("load_state", "full_state", "full_optimizer_state", "gather"):  # the README example uses them
        assert name in documented


def test_the_task_example_passes_the_registry_learns_and_serves():
    from training_runtime.data.info import DataInfo
    from training_runtime.tasks.registry import task_class, task_from_card

    cls = task_class(TASK)  # an import path, checked as a pipeline's task is
    info = DataInfo.from_manifest({"format": "model-factory.shards/v1", "feature_shape": [2], "num_classes": 3,
                                   "class_names": ["a", "b", "c"]})
    task = cls(info)
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 3, size=96))
    x = torch.randn(96, 2) * 0.3 + torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])[labels]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, task.num_outputs()))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        outputs, targets = task.forward(model, {"input": x, "target": labels})
        loss = task.loss(outputs, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        outputs, targets = task.forward(model, {"input": x, "target": labels})
        metrics = task.new_metrics(torch.device("cpu"))
        for start in range(0, 96, 32):  # three batches, as an evaluation feeds them
            metrics.update(outputs[start:start + 32], targets[start:start + 32])
        figures = metrics.compute()
    right = int((outputs.argmax(dim=-1) == labels).sum())
    assert figures["num_samples"] == 96 and figures["accuracy"] == pytest.approx(right / 96)
    assert figures["accuracy"] > 0.9  # three separated clusters
    assert figures["loss"] == pytest.approx(float(F.cross_entropy(outputs, labels)), rel=1e-5)
    assert set(cls.metric_names) <= set(figures)
    # Serving finds the class again from the card and reads its predictions as a classifier's.
    card = task.card()
    assert card == {"name": "classification", "import_path": TASK}
    served = task_from_card(card, info)
    assert type(served) is cls
    predicted = served.predict(outputs.numpy())  # ONNX hands numpy arrays
    np.testing.assert_array_equal(predicted["class_index"], outputs.argmax(dim=-1).numpy())
    assert predicted["probabilities"].shape == (96, 3)
