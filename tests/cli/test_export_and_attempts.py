"""``export`` writes a version's folder byte for byte with a README whose code runs; the lineage
names that folder; ``lineage`` and ``compare`` show attempts, restarts and resumed_from_step
(from the runtime's per-attempt list, or from the older counts)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from core.lineage import attempts_summary, lineage_rows, version_folder
from core.registry import alias_path, version_prefix, version_tag
from core.versions import register_version
from pipelines.cli import main
from pipelines.cli.compare import compare_rows
from pipelines.profiles import Profile
from resources.store.base import MAIN
from tests.cli.records import make_record


@pytest.fixture
def registered(tmp_path):
    """A real model folder (card, weights, ONNX) registered as toy v1 in a local platform at tmp_path."""
    from tests.serving.test_card_alone import TABLE, model_folder

    folder = model_folder(tmp_path / "model", "mlp", TABLE, {"hidden_sizes": [8]})
    files = {name: (folder / name).read_bytes() for name in ("model.safetensors", "model_card.json", "model.onnx")}
    store = Profile(name="local", data_root=tmp_path / "platform").store()
    store.ensure_repository()
    store.create_branch("run-1", MAIN)
    sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
    record = lambda v: {**make_record(v), "checkpoint": {**make_record(v)["checkpoint"], "sha256": sha},  # noqa: E731
                        "version_folder": version_folder("toy", v)}
    register_version(store, "run-1", "toy", record, files, {})
    return tmp_path, store, files


@pytest.fixture
def cli(monkeypatch, capsys):
    """``python -m pipelines ARGS`` against the platform at ``home``, in this process: (status, out, err)."""
    def run(home: Path, *args: str) -> tuple[int, str, str]:
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        monkeypatch.delenv("PLATFORM_PROFILE", raising=False)
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_export_writes_the_version_folder_byte_for_byte_with_a_readme_that_runs(registered, cli):
    home, store, files = registered
    out = home / "deploy"
    status, printed, err = cli(home, "export", "toy", "--version", "1", str(out))
    assert status == 0, err
    stored = store.get_object(version_tag("toy", 1), version_prefix("toy", 1) + "lineage.json")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "lineage.json", "model.onnx", "model.safetensors",
                                                     "model_card.json"]
    for name, content in {**files, "lineage.json": stored}.items():
        assert (out / name).read_bytes() == content, name
        assert hashlib.sha256(content).hexdigest() in printed
    # The README's code blocks load the folder as they say (safetensors, then onnxruntime on an input).
    readme = (out / "README.md").read_text()
    assert "models/toy/versions/v1/ at tag `toy-v1`" in readme.replace("` at", " at")
    scope = {"x": np.zeros((2, 3), dtype=np.float32)}
    cwd = os.getcwd()
    os.chdir(out)
    try:
        for block in re.findall(r"```python\n(.*?)```", readme, flags=re.S):
            exec(block, scope)  # noqa: S102 (the README's own examples)
    finally:
        os.chdir(cwd)
    assert tuple(scope["state"]["net.1.weight"].shape) == (8, 3)  # the mlp's first layer: 3 features, 8 wide
    assert scope["outputs"].shape == (2, 1)

    # Into a folder that holds something: refused, nothing overwritten.
    status, _, err = cli(home, "export", "toy", str(out))
    assert status == 2 and "is not an empty folder" in err


def test_export_by_alias_and_a_damaged_copy_is_refused(registered, cli):
    home, store, files = registered
    store.put_object(MAIN, alias_path("toy"), json.dumps({"model": "toy", "alias": "production", "version": 1,
                                                          "previous": [], "history": []}).encode())
    store.commit(MAIN, "alias", {})
    assert cli(home, "export", "toy", "--alias", "production", str(home / "by_alias"))[0] == 0
    assert (home / "by_alias" / "model.safetensors").read_bytes() == files["model.safetensors"]

    branch = "damage"
    store.create_branch(branch, MAIN)
    store.put_object(branch, version_prefix("toy", 1) + "model.safetensors", files["model.safetensors"][:-1] + b"\0")
    store.commit(branch, "damage", {})
    store.delete_tag(version_tag("toy", 1))  # as if the tagged copy had been damaged
    store.create_tag(version_tag("toy", 1), store.resolve_ref(branch))
    status, _, err = cli(home, "export", "toy", str(home / "damaged"))
    assert status == 2 and "the store's copy is damaged" in err
    assert not (home / "damaged").exists()


def test_the_lineage_names_the_version_folder_and_how_to_export_it():
    rows = {r.field: r.value for r in lineage_rows(make_record(3))}
    assert rows["version folder"] == ("models/toy/versions/v3/ at tag toy-v3 "
                                      "(export: python -m pipelines export toy --version 3 DIR)")


CLEAN = {"training.restart_count": 0, "training_figures.resumed_from_step": None}
RESUMED = {"training.restart_count": 1, "training_figures.resumed_from_step": 40}
ATTEMPTS = [{"restart_count": 0, "resumed_from_step": None, "ended": "restarted", "reason": "worker killed (SIGKILL)",
             "detections": [{"detector": "hang"}]},
            {"restart_count": 1, "resumed_from_step": 40, "ended": "completed", "reason": None, "detections": []}]


def test_lineage_shows_attempts_from_the_runtime_list_or_the_older_counts():
    assert attempts_summary(make_record(1, **CLEAN)) == "1 attempt, no restart"
    assert attempts_summary(make_record(2, **RESUMED)) == "2 attempt(s), 1 restart(s), resumed from step 40"
    listed = make_record(3, **{"training.attempts": ATTEMPTS})
    assert attempts_summary(listed) == ("2 attempt(s): 1 restarted (worker killed (SIGKILL)), 1 detection(s); "
                                        "2 completed, resumed from step 40")
    old = make_record(4)  # registered before attempts were recorded
    assert attempts_summary(old) == "not recorded (the record predates attempt counts)"
    assert {r.field: r.value for r in lineage_rows(listed)}["attempts"] == attempts_summary(listed)


def test_compare_tells_a_resumed_version_from_a_clean_one():
    rows = {(s, f): (v, d) for s, f, v, d in compare_rows([make_record(1, **CLEAN), make_record(2, **RESUMED),
                                                          make_record(3, **{"training.attempts": ATTEMPTS})])}
    assert rows[("attempts", "attempts")] == ([1, 2, 2], True)
    assert rows[("attempts", "restarts")] == ([0, 1, 1], True)
    assert rows[("attempts", "resumed from step")] == ([None, 40, 40], True)
    assert rows[("attempts", "attempt 1")][0][2] == "restarted (worker killed (SIGKILL))"
