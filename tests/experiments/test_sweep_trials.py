"""The sweep loop around Optuna, with stand-in launches: parallel slots, pruning, crashed trials,
and a sweep killed mid-way resuming without repeating a trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from core.sweep import Choice, IntRange, LogRange, Sweep
from ops.sweep_trials import (
    COMPLETE, FAILED, PRUNED, SweepRunner, decode_params, distributions, open_study, trial_overrides)
from tests.experiments.fake_trials import VALIDATIONS, FakeLaunches, objective

SPACE = {"train.lr": LogRange(1e-4, 1.0), "model.hidden_sizes": Choice([16], [32, 16])}


def _runner(tmp_path, sweep, launches, name="s"):
    study = open_study(f"sqlite:///{tmp_path / 'optuna.sqlite'}", name, sweep, "minimize")
    return SweepRunner(sweep, study, objective="loss", trial_root=tmp_path / "trials", launch=launches,
                       log=lambda line: None, poll_s=0.01)


def test_pruned_trials_stop_early_and_free_their_slots(tmp_path):
    sweep = Sweep(space=SPACE, objective="loss", trials=10, parallelism=2, sampler="random", pruner="median",
                  startup_trials=2, prune_after_validations=1, seed=0)
    # 0.1 s between validations: the sweep's loop must read one and answer before the next, which
    # on a loaded machine (the study's SQLite writes) 0.05 s did not always leave.
    launches = FakeLaunches(delay_s=0.1)
    result = _runner(tmp_path, sweep, launches).run()

    states = [r.state for r in result.records]
    assert len(states) == 10 and launches.peak == 2  # never more than the sweep's parallelism
    assert PRUNED in states and COMPLETE in states
    for r in result.records:
        if r.state == PRUNED:
            # Stopped at the validation after the one that decided it, not run to the end.
            assert launches.validations[r.number] < VALIDATIONS
            assert r.pruned_step == launches.validations[r.number] * 10
        else:
            assert launches.validations[r.number] == VALIDATIONS
    # Every trial ran exactly once: a pruned trial's slot went to the next one.
    assert sorted(launches.launched) == list(range(10))
    # The UI's table: one row per trial, every row with every column.
    from ops.sweep import trials_table

    table = trials_table(result.records)
    assert [row.data["trial"] for row in table.records] == list(range(10))
    assert {row.data["state"] for row in table.records} == {COMPLETE, PRUNED}
    assert all(row.data["pruned_step"] for row in table.records
               if row.data["state"] == PRUNED)
    assert all(r.last_value is not None for r in result.records)
    best = min((r for r in result.records if r.state == COMPLETE), key=lambda r: r.value)
    assert result.best.number == best.number
    assert result.best.value == pytest.approx(objective(best.params, VALIDATIONS))


def test_a_crashed_trial_restarts_once_then_counts_as_failed_and_the_sweep_goes_on(tmp_path):
    sweep = Sweep(space=SPACE, objective="loss", trials=3, parallelism=1, sampler="random", pruner="none", retries=1)
    launches = FakeLaunches(crash={0: 1, 1: 5})  # trial 0 crashes once, trial 1 every time
    result = _runner(tmp_path, sweep, launches).run()

    by_number = {r.number: r for r in result.records}
    assert by_number[0].state == COMPLETE and by_number[0].attempts == 2
    assert by_number[1].state == FAILED and by_number[1].attempts == 2
    assert "worker of trial 1 died" in by_number[1].error
    assert by_number[2].state == COMPLETE
    assert launches.launched == [0, 0, 1, 1, 2]


def test_spaces_become_optuna_distributions_and_lists_survive_the_storage(tmp_path):
    sweep = Sweep(space={**SPACE, "train.epochs": IntRange(2, 8, step=2)}, objective="loss", trials=4,
                  parallelism=1, sampler="random", pruner="none")
    d = distributions(sweep)
    assert d["train.lr"].log and d["train.epochs"].step == 2
    launches = FakeLaunches(delay_s=0.0)
    result = _runner(tmp_path, sweep, launches).run()
    for r in result.records:
        assert r.params["model.hidden_sizes"] in ([16], [32, 16]) and r.params["train.epochs"] in (2, 4, 6, 8)
    assert trial_overrides({"train.lr": 0.1, "model.hidden_sizes": [8]}, "accuracy", "maximize") == {
        "train": {"lr": 0.1, "monitor": "accuracy", "monitor_mode": "max"}, "model": {"hidden_sizes": [8]}}
    assert decode_params({"a": 'json:[1, 2]', "b": 3}) == {"a": [1, 2], "b": 3}


WORKER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.experiments.test_sweep_trials import _runner, KILL_SWEEP
from tests.experiments.fake_trials import FakeLaunches
runner = _runner(Path({tmp!r}), KILL_SWEEP, FakeLaunches(delay_s=0.15))
runner.run()
"""
KILL_SWEEP = Sweep(space=SPACE, objective="loss", trials=6, parallelism=2, sampler="tpe", pruner="none",
                   startup_trials=2, seed=1)


def test_a_killed_sweep_resumes_where_it_stopped_without_repeating_a_trial(tmp_path):
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", WORKER.format(root=root, tmp=str(tmp_path))],
                            start_new_session=True)
    storage = f"sqlite:///{tmp_path / 'optuna.sqlite'}"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # kill it once two trials finished and others run
            try:
                trials = optuna.load_study(study_name="s", storage=storage).trials
            except KeyError:
                trials = []
            if sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) >= 2 and any(
                    t.state == optuna.trial.TrialState.RUNNING for t in trials):
                break
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    before = optuna.load_study(study_name="s", storage=storage).trials
    finished = {t.number for t in before if t.state.is_finished()}
    cut_off = {t.number for t in before if t.state == optuna.trial.TrialState.RUNNING}
    assert finished and cut_off

    launches = FakeLaunches(delay_s=0.0)
    result = _runner(tmp_path, KILL_SWEEP, launches).run()

    assert not finished & set(launches.launched)  # finished trials never run again
    assert cut_off <= set(launches.launched)  # cut-off trials resume under their own numbers
    assert len(result.records) == 6 and all(r.state == COMPLETE for r in result.records)
    assert len(launches.launched) == 6 - len(finished)
    # Their validations were read again from their files, not reported twice.
    for r in result.records:
        assert r.validations == VALIDATIONS
    assert json.loads((Path(result.records[0].folder) / "output" / "metrics.json").read_text())["best_value"] is not None


def test_a_sweep_killed_inside_ask_resumes_its_half_asked_trials_with_every_parameter(tmp_path):
    """``study.ask`` stores the trial's row, then its parameters one at a time: a kill in between
    left a RUNNING trial without some of them, and resuming it failed the trial on the missing key
    (seen once in make test, in the kill test above)."""
    sweep = Sweep(space=SPACE, objective="loss", trials=3, parallelism=2, sampler="tpe", pruner="none",
                  startup_trials=2, seed=1)
    launches = FakeLaunches(delay_s=0.0)
    runner = _runner(tmp_path, sweep, launches)
    study, storage = runner.study, runner.study._storage  # noqa: SLF001
    # What the kill leaves: one trial with only its learning rate stored, one with no parameter.
    partial = storage.create_new_trial(study._study_id)  # noqa: SLF001
    storage.set_trial_param(partial, "train.lr", 0.01, runner.distributions["train.lr"])
    storage.create_new_trial(study._study_id)  # noqa: SLF001

    result = runner.run()

    assert [r.state for r in result.records] == [COMPLETE] * 3
    assert sorted(launches.launched) == [0, 1, 2]  # the two cut-off trials under their own numbers
    for r in result.records:
        assert set(r.params) == set(SPACE)
    assert result.records[0].params["train.lr"] == 0.01  # a stored value is kept, not drawn again


def test_a_grid_sweep_ends_when_its_last_grid_point_is_told(tmp_path):
    """Optuna's grid sampler calls study.stop() after the last grid point; outside
    study.optimize that raised RuntimeError and failed the step once every trial had finished
    (found by the soak, tests/reliability/soak)."""
    sweep = Sweep(space={"train.lr": Choice(0.01, 0.1)}, objective="loss", trials=2, parallelism=2, sampler="grid",
                  pruner="none")
    result = _runner(tmp_path, sweep, FakeLaunches()).run()
    assert [r.state for r in result.records] == [COMPLETE, COMPLETE]


def test_a_grid_sweep_over_list_choices_tries_every_grid_point(tmp_path):
    """A grid over hidden sizes: the grid sampler's values must be the distributions' (JSON text
    for a list), or the first ask failed with "'[32, 16]' not in ('json:[16]', 'json:[32, 16]')"."""
    sweep = Sweep(space={"train.lr": Choice(0.01, 0.1), "model.hidden_sizes": Choice([16], [32, 16])},
                  objective="loss", trials=4, parallelism=2, sampler="grid", pruner="none")
    result = _runner(tmp_path, sweep, FakeLaunches(delay_s=0.0)).run()
    assert [r.state for r in result.records] == [COMPLETE] * 4
    points = sorted((r.params["train.lr"], r.params["model.hidden_sizes"]) for r in result.records)
    assert points == [(0.01, [16]), (0.01, [32, 16]), (0.1, [16]), (0.1, [32, 16])]


def test_a_sweep_whose_every_trial_failed_says_why_in_its_failure(tmp_path):
    """The step's error names each trial's cause, not only "see each trial's log above" (the
    soak found a sweep failed by a NaN whose error named nothing)."""
    import dataclasses

    import dagster as dg

    from ops.sweep import run_sweep
    from pipelines.models.wine import wine_pipeline

    spec = dataclasses.replace(wine_pipeline, sweep=Sweep(space={"train.lr": Choice(1e37, 1e38)}, objective="loss",
                                                          trials=2, parallelism=2, sampler="grid", pruner="none"))

    def train(trial_spec, folder, **_):
        raise dg.Failure(description=f"training 'wine' failed, not retried: non-finite loss at step 2 (lr "
                                     f"{trial_spec.recipe.lr:g})", allow_retries=False)

    @dg.asset(key=["wine", "checkpoint"])
    def checkpoint(context):
        run_sweep(context, spec, tmp_path / "work", context.run_id, train=train, result_from=lambda path: None)

    with dg.instance_for_test() as instance:
        result = dg.materialize([checkpoint], instance=instance, raise_on_error=False)
    (failure,) = result.get_step_failure_events()
    text = failure.step_failure_data.user_failure_data.description
    assert "no trial finished with a validation loss (0 pruned, 2 failed)" in text
    causes = sorted(line for line in text.splitlines() if line.startswith("trial "))
    assert [c.split(":")[0] for c in causes] == ["trial 0", "trial 1"]
    assert {c.rsplit("(lr ", 1)[1] for c in causes} == {"1e+37)", "1e+38)"}
    assert all("Failure: training 'wine' failed, not retried: non-finite loss at step 2" in c for c in causes)


PRUNE_KILL_WORKER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.experiments.test_sweep_trials import _runner, PRUNE_KILL_SWEEP
from tests.experiments.fake_trials import FakeLaunches
runner = _runner(Path({tmp!r}), PRUNE_KILL_SWEEP, FakeLaunches(delay_s=0.15, hang_when_pruned=True))
runner.run_id = "killed-run"
runner.run()
"""
# Seed 4 draws trial 2 far from the best learning rate: the median pruner stops it while trial 3 trains.
PRUNE_KILL_SWEEP = Sweep(space=SPACE, objective="loss", trials=6, parallelism=2, sampler="random", pruner="median",
                         startup_trials=2, prune_after_validations=1, seed=4)


def test_a_sweep_killed_after_a_pruned_trial_ended_keeps_it_pruned_and_counts_every_launch(tmp_path):
    """Issue 45: the run worker killed after two trials finished and a third, pruned, had stopped
    and written its outputs, before the sweep told the study. The retry relaunched it (0 steps),
    overwrote its metrics.json and counted it complete; trials launched twice said 1 attempt."""
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", PRUNE_KILL_WORKER.format(root=root, tmp=str(tmp_path))],
                            start_new_session=True)
    storage = f"sqlite:///{tmp_path / 'optuna.sqlite'}"
    running = optuna.trial.TrialState.RUNNING
    ended = lambda t: (tmp_path / "trials" / f"trial-{t.number:03d}" / "output" / "metrics.json").exists()  # noqa: E731
    deadline = time.monotonic() + 120
    try:
        while True:  # kill once two trials are complete and a pruned one has ended, still RUNNING in the study
            assert time.monotonic() < deadline, "no trial was pruned before the sweep's end"
            try:
                trials = optuna.load_study(study_name="s", storage=storage).trials
            except KeyError:
                trials = []
            if sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) >= 2 and any(
                    t.state == running and ended(t) for t in trials) and any(
                    t.state == running and not ended(t) for t in trials):
                break
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    before = optuna.load_study(study_name="s", storage=storage).trials
    (pruned,) = [t.number for t in before if t.state == running and ended(t)]
    cut_off = [t.number for t in before if t.state == running and not ended(t)]
    finished = {t.number for t in before if t.state.is_finished()}
    pruned_metrics = (tmp_path / "trials" / f"trial-{pruned:03d}" / "output" / "metrics.json").read_bytes()
    assert json.loads(pruned_metrics)["pruned"] and cut_off

    recovered = []
    launches = FakeLaunches(delay_s=0.0)
    runner = _runner(tmp_path, PRUNE_KILL_SWEEP, launches)
    runner.run_id, runner.recover = "retry-run", lambda plan: recovered.append(plan.number)
    result = runner.run()

    by_number = {r.number: r for r in result.records}
    # The pruned trial is told from what it wrote: never launched again, its metrics.json untouched.
    assert pruned not in launches.launched
    assert (tmp_path / "trials" / f"trial-{pruned:03d}" / "output" / "metrics.json").read_bytes() == pruned_metrics
    assert by_number[pruned].state == PRUNED and by_number[pruned].pruned_step == json.loads(pruned_metrics)[
        "pruned_at_step"]
    assert by_number[pruned].attempts == 1 and by_number[pruned].runs == ["killed-run", "retry-run"]
    assert by_number[pruned].validations == by_number[pruned].pruned_step // 10
    # The trial cut off mid-training resumes; it was launched twice, once by each run.
    for n in cut_off:
        assert launches.launched.count(n) == 1
        assert by_number[n].attempts == 2 and by_number[n].resumed and by_number[n].runs == ["killed-run", "retry-run"]
    assert sorted(recovered) == sorted([pruned, *cut_off])  # the op reports their unread messages there
    assert not finished & set(launches.launched)
    for n in finished:
        assert by_number[n].attempts == 1 and by_number[n].runs == ["killed-run"] and not by_number[n].resumed
    assert result.summary()["pruned"] >= 1 and result.summary()["trials"] == 6


def test_how_a_run_worker_died_is_read_from_the_killed_run_s_log():
    """The retry names the death in Dagster's own words (the code server's or the run monitor's),
    without its guess about memory; a run that failed in a step has no such words."""
    import dagster as dg

    from ops.sweep import worker_death

    with dg.instance_for_test() as instance:
        runs = [instance.create_run_for_job(dg.GraphDefinition("g").to_job()) for _ in range(3)]
        instance.report_engine_event("Run execution process for r0 was terminated by signal 9 (SIGKILL). This "
                                     "usually indicates that the process was killed by the operating system", runs[0])
        instance.report_run_failed(runs[1], "Detected run worker status WorkerStatus.FAILED: 'run worker process 4242 "
                                            "is gone (killed or crashed)'. Marking run r1 as failed")
        instance.report_run_failed(runs[2], "Execution of step 'train' failed.")
        assert worker_death(instance, runs[0].run_id) == "its process was terminated by signal 9 (SIGKILL)"
        assert worker_death(instance, runs[1].run_id) == "run worker process 4242 is gone (killed or crashed)"
        assert worker_death(instance, runs[2].run_id) is None
