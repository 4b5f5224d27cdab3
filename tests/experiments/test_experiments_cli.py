"""``python -m pipelines train --set`` and ``sweeps`` as a user runs them, on a temporary DAGSTER_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from core.overrides import OVERRIDES_TAG
from core.registry import read_lineage
from core.sweep import Choice, LogRange, Sweep
from ops.sweep import study_name, sweep_storage_url
from ops.sweep_trials import SweepRunner, open_study
from pipelines.profiles import Profile
from tests.cli.demo_platform import write_instance_config
from tests.experiments.fake_trials import FakeLaunches

REPO = Path(__file__).resolve().parents[2]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE")}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_train_with_overrides_records_them_and_tags_the_run(tmp_path):
    home = tmp_path / "home"
    write_instance_config(home)
    out = cli(home, "train", "wine", "--no-sweep", "--set", "train.epochs=2", "--set", "train.world_size=1",
              "--set", "train.seed=7", "--set", "gate.test_accuracy.min=0.1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "train.epochs 30 -> 2" in out.stdout and "train.seed 0 -> 7" in out.stdout  # the lineage row

    record = read_lineage(Profile(name="local", data_root=home / "platform").store(), "wine")
    assert record["overrides"] == {"gate.test_accuracy.min": {"pipeline": 0.8, "run": 0.1},
                                   "train.epochs": {"pipeline": 30, "run": 2},
                                   "train.seed": {"pipeline": 0, "run": 7},
                                   "train.world_size": {"pipeline": 2, "run": 1}}
    assert record["training"]["config"]["train"]["seed"] == 7 and record["sweep"] is None
    assert record["quality_gate"]["bounds"]["test_accuracy"] == {"min": 0.1}  # the evaluation used the run's gate
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
    assert run.tags[OVERRIDES_TAG] == ('gate.test_accuracy.min=0.1 train.epochs=2 train.seed=7 '
                                       'train.world_size=1')


def test_a_bad_override_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    home = tmp_path / "home"
    write_instance_config(home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for value, message in (("train.lr=-1", "field 'recipe.lr': must be positive"),
                           ("train.lrr=1", "the recipe has no field 'lrr'"),
                           ("train.epochs=2.5", "override train.epochs: 2.5 is not a int"),
                           ("lr=1", "write <section>.<field>=<value>")):
        assert main(["train", "wine", "--set", value]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_runs() == []


def test_sweeps_lists_trials_and_compares_two(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    home = tmp_path / "home"
    write_instance_config(home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    def cli(_home, *args):
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    sweep = Sweep(space={"train.lr": LogRange(1e-3, 1e-1), "model.hidden_sizes": Choice([16], [32])},
                  objective="loss", trials=4, parallelism=2, sampler="random", pruner="none")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        study = open_study(sweep_storage_url(instance), study_name("wine", "run1"), sweep, "minimize")
    study.set_user_attr("model", "wine")
    study.set_user_attr("run_id", "run1")
    result = SweepRunner(sweep, study, objective="loss", trial_root=tmp_path / "trials",
                         launch=FakeLaunches(delay_s=0.0), log=lambda line: None, poll_s=0.01).run()

    out = cli(home, "sweeps", "wine")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("wine-run1  (run run1, minimize, 4 trials: 4 complete, 0 pruned, 0 failed; "
                                 f"best trial {result.best.number})")
    assert len([line for line in out.stdout.splitlines() if line.split()[:1] in (["*"], *[[str(n)] for n in range(4)])]) == 4

    out = cli(home, "sweeps", "wine", "--compare", "0", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "wine-run1: trial 0 vs trial 1"
    lr = next(line.split() for line in out.stdout.splitlines() if "train.lr" in line)
    assert lr[0] == "*"  # two random learning rates differ

    listed = json.loads(cli(home, "sweeps", "wine", "--json").stdout)
    assert [t["number"] for t in listed[0]["trials"]] == [0, 1, 2, 3]
    assert cli(home, "sweeps", "digits").stdout.startswith("model 'digits' has no sweeps")
    bad = cli(home, "sweeps", "wine", "--compare", "0", "9")
    assert bad.returncode == 2 and "has no trial 9" in bad.stderr


def test_a_resumed_sweep_names_the_killed_run_in_sweeps_and_the_lineage():
    """Issue 45: a retry that resumed a sweep says which run it resumed and why; each trial its
    launches and its own log folder."""
    from core.experiment_lineage import sweep_summary, trial_line
    from pipelines.cli.experiments import resumed_lines

    runs = [{"run_id": "r1", "parent_run_id": None, "cut_off_trials": []},
            {"run_id": "r2", "parent_run_id": "r1", "cut_off_trials": [2, 3],
             "parent_ended": "run worker process 41 is gone (killed or crashed)"}]
    assert resumed_lines(runs) == ["  resumed by run r2 after run r1 ended: its run worker died (run worker process 41 "
                                   "is gone (killed or crashed)); trials cut off: 2, 3"]
    summary = sweep_summary({"best_trial": 1, "trials": 6, "objective": "loss", "best_value": 0.5, "runs": runs,
                             "direction": "minimize", "complete": 4, "pruned": 2, "failed": 0, "study": "s"})
    assert summary.endswith("; resumed by run r2, a retry of run r1 whose run worker died (run worker process 41 is "
                            "gone (killed or crashed)), trials cut off: 2, 3")
    trial = {"number": 3, "state": "complete", "value": 0.25, "validations": 6, "params": {"train.lr": 0.05},
             "attempts": 2, "resumed": True, "logs_uri": "file:///a/runs/r2/wine/checkpoint/logs/trial-003"}
    assert trial_line(trial) == ("#3 complete value 0.25 (6 validations, 2 launches, resumed after a kill)  "
                                 "train.lr=0.05  logs file:///a/runs/r2/wine/checkpoint/logs/trial-003")
