"""The user-path matrix: the same end-to-end assertions for (a) a platform pipeline with the
built-in trainer and (b) a team location in a folder outside the repository with its own training
function and its own Task (tests/user_paths/matrix.py). Every step is a ``python -m pipelines``
command in a fresh process on one empty DAGSTER_HOME.

Runs are shared where an assertion allows: the override run is also the one ``predict`` checks and
the one the killed run must equal. Faults are injected as the runtime's tests inject them
(``TRAINING_RUNTIME_FAULT_*``, read by training_runtime/__main__.py in the workers); the NaN is a
real divergence, a learning rate of 1e37 (finite weights after the first step, non-finite losses
from the second on, on every attempt: a retry could not fix it).

The session prints what each command cost (``-s`` shows it); the whole matrix is about 12
commands per path.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.user_paths.matrix import VARIANTS, MatrixPlatform, Variant, failure_lines

pytestmark = pytest.mark.slow

PATHS = sorted(VARIANTS)
OVERRIDE = ("--set", "train.lr=0.03")  # recorded in the lineage; the killed run trains with it too
KILL_AT = "0:6"  # rank 0 SIGKILLs itself after step 6 on the first attempt; checkpoints every 4 steps


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    platform = MatrixPlatform.create(tmp_path_factory.mktemp("user-paths"))
    yield platform
    print(f"\nuser-path matrix, command by command:\n{platform.report_timings()}")


def trained(matrix: MatrixPlatform, v: Variant):
    """The override run: version 1 of the model, trained once (no sweep) with OVERRIDE."""
    return matrix.once(v, "trained", "train", v.model, "--no-sweep", *OVERRIDE)


@pytest.mark.parametrize("path", PATHS)
def test_trains_and_registers_with_the_override_recorded(matrix, path):
    v = VARIANTS[path]
    proc = trained(matrix, v)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    record = matrix.lineage(v.model, 1)
    assert record["overrides"] == {"train.lr": {"pipeline": 0.01 if path == "platform" else 0.02, "run": 0.03}}
    assert record["training"]["config"]["train"]["lr"] == 0.03
    assert "train.lr" in proc.stdout and "overrides" in proc.stdout  # the lineage it printed shows the row
    (run,) = [r for r in matrix.runs_of(v.model) if r.run_id == record["dagster"]["run_id"]]
    assert run.tags["platform/overrides"] == "train.lr=0.03"
    assert run.tags["platform/team"] == v.team  # a team location's runs carry its own name
    if path == "team":
        assert record["task"] == "cellar.task:SmoothedClassification"
        assert record["training"]["config"]["train_fn"] == "cellar.train:fit"
    # The CLI wrote the platform's instance config into the empty home.
    assert (matrix.home / "dagster.yaml").read_text().startswith("# The local instance")


@pytest.mark.parametrize("path", PATHS)
def test_predict_agrees_with_the_registered_metrics(matrix, path):
    v = VARIANTS[path]
    assert trained(matrix, v).returncode == 0
    record = matrix.lineage(v.model, 1)
    rows = matrix.test_rows(v, record)
    csv = matrix.root / f"{v.model}-test.csv"
    rows[[v.id_column, *v.features]].to_csv(csv, index=False)
    proc = matrix.cli("predict", v.model, str(csv), "--version", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    predicted = [p["class"] for p in json.loads(proc.stdout)["predictions"]]
    truth = [str(label) for label in rows[v.label]]
    test = record["evaluation"]["test"]
    assert len(predicted) == test["num_samples"] == len(truth)
    hits = sum(p == t for p, t in zip(predicted, truth))
    # The same rows right: the count the registered accuracy stands for (a float32 figure for the team's task).
    assert hits == round(test["accuracy"] * len(truth)) and hits / len(truth) == pytest.approx(test["accuracy"])


@pytest.mark.parametrize("path", PATHS)
def test_a_killed_rank_resumes_to_equal_weights(matrix, path):
    v = VARIANTS[path]
    assert trained(matrix, v).returncode == 0
    proc = matrix.once(v, "killed", "train", v.model, "--no-sweep", *OVERRIDE,
                       env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": KILL_AT})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    record = matrix.lineage(v.model, 2)
    logs = matrix.rank_logs(v.model, record["dagster"]["run_id"])
    assert any("/attempt_1/" in name for name in logs), sorted(logs)  # torchrun restarted the killed rank
    assert record["training_figures"]["resumed_from_step"] == 4
    before, after = matrix.weights(v.model, 1), matrix.weights(v.model, 2)
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("path", PATHS)
def test_a_hanging_rank_is_caught_by_the_watchdog_with_stacks_and_resumes(matrix, path):
    v = VARIANTS[path]
    # Two ranks: rank 1 stops itself (SIGSTOP) after step 6; rank 0's watchdog sees no step for 5 s.
    proc = matrix.once(v, "hung", "train", v.model, "--no-sweep", "--set", "train.world_size=2",
                       "--set", "guards.hang_timeout_s=5", "--set", "train.collective_timeout_s=60",
                       env={"TRAINING_RUNTIME_FAULT_STOP_AT_STEP": "1:6"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    runs = [r for r in matrix.runs_of(v.model) if r.tags.get("platform/overrides", "").startswith("guards.")]
    (run,) = runs
    logs = "\n".join(matrix.rank_logs(v.model, run.run_id).values())
    assert re.search(r"hang: rank \d finished no training step for", logs), logs[-4000:]
    assert "(most recent call first)" in logs  # every rank's stacks, printed by the watchdog
    record = matrix.version_of_run(v.model, run.run_id)
    assert record["training_figures"]["resumed_from_step"] is not None
    assert any(d["detector"] == "hang" for d in record["training"]["detections"])


@pytest.mark.parametrize("path", PATHS)
def test_a_nan_stops_the_run_once_naming_step_and_rank_and_keeps_the_last_good_checkpoint(matrix, path):
    v = VARIANTS[path]
    proc = matrix.once(v, "nan", "train", v.model, "--no-sweep", "--set", "train.lr=1e37",
                       "--set", "train.checkpoint_every_steps=1")
    assert proc.returncode == 1, proc.stdout[-3000:]
    failed = failure_lines(proc)
    found = re.search(r"non-finite loss at step (\d+) on rank (\d+)", failed)
    assert found, failed or proc.stderr[-4000:]
    step = int(found.group(1))
    assert f"{v.model}" in failed and "distributed_training" in failed  # the step, in the final error
    (run,) = [r for r in matrix.runs_of(v.model) if "train.lr=1e+37" in r.tags.get("platform/overrides", "")]
    launches = matrix.launch_dirs(v.model, run.run_id)
    assert len(launches) == 1, launches  # no Dagster retry
    attempts = {p.name for p in launches[0].rglob("attempt_*")}
    assert attempts == {"attempt_0"}, attempts  # no torchrun restart
    kept = matrix.checkpoints(v.model, run.run_id)
    assert kept and int(kept[-1].name.split("_")[1]) < step, kept  # the last good one, from before the NaN
    from training_runtime.checkpoint.full import verify_checkpoint

    verify_checkpoint(kept[-1])


@pytest.mark.parametrize("path", PATHS)
def test_a_sweep_of_two_trials_registers_its_best_trial(matrix, path):
    v = VARIANTS[path]
    proc = matrix.once(v, "sweep", "train", v.model)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run,) = [r for r in matrix.runs_of(v.model) if "platform/overrides" not in r.tags]
    record = matrix.version_of_run(v.model, run.run_id)
    sweep = record["sweep"]
    assert sweep["trials"] == 2 and sweep["complete"] == 2, sweep
    assert sorted(r["params"]["train.seed"] for r in sweep["records"]) == [1, 2]
    best = min(sweep["records"], key=lambda r: r["value"])  # the objective is the validation loss
    assert sweep["best_trial"] == best["number"] and record["training"]["seed"] == best["params"]["train.seed"]
    listed = matrix.cli("sweeps", v.model, "--json")
    assert listed.returncode == 0, listed.stderr
    (study,) = json.loads(listed.stdout)
    assert len(study["trials"]) == 2 and {t["state"] for t in study["trials"]} == {"complete"}
