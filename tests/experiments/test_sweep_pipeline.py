"""A sweep through the whole pipeline: real torchrun trials (one gloo rank each), two at a time,
the study in the instance's SQLite, the best trial's model evaluated and registered."""

from __future__ import annotations

import dataclasses
import hashlib

import dagster as dg
import pytest

from core.registry import read_lineage
from core.sweep import Choice, LogRange, Sweep
from ops.sweep import study_name, sweep_storage_url
from pipelines.models.wine import wine_pipeline
from tests.pipeline.conftest import failure_messages

pytestmark = pytest.mark.slow

SWEEP = Sweep(space={"train.lr": LogRange(1e-3, 1e-1), "model.hidden_sizes": Choice([16], [32])},
              objective="loss", trials=3, parallelism=2, startup_trials=1, prune_after_validations=1, seed=3)


def small_wine(sweep=SWEEP):
    recipe = dataclasses.replace(wine_pipeline.recipe, epochs=4, world_size=1)
    return dataclasses.replace(wine_pipeline, recipe=recipe, sweep=sweep,
                               gate=dataclasses.replace(wine_pipeline.gate, min_test_accuracy=0.0))


def test_the_best_trial_is_registered_with_every_trial_in_its_lineage(platform):
    import optuna

    spec = small_wine()
    result = platform.run(spec)
    assert result.success, failure_messages(result)
    # Two trials at a time, each through its own Pipes reader: none died on a message (a torn line
    # once ended a trial's reader while the run still succeeded). Its events are in the event log.
    dead_readers = [e.message for e in platform.instance.all_logs(result.run_id)
                    if "[pipes] framework exception" in (e.message or "")]
    assert not dead_readers, dead_readers

    record = read_lineage(platform.store(), "wine")
    sweep = record["sweep"]
    assert sweep["trials"] == 3 and len(sweep["records"]) == 3
    assert {r["number"] for r in sweep["records"]} == {0, 1, 2}
    assert all(r["params"]["model.hidden_sizes"] in ([16], [32]) for r in sweep["records"])
    assert all(1e-3 <= r["params"]["train.lr"] <= 1e-1 for r in sweep["records"])

    # The study in the instance's database agrees, and its best trial is the registered one.
    study = optuna.load_study(study_name=study_name("wine", result.run_id),
                              storage=sweep_storage_url(platform.instance))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and sweep["best_trial"] == study.best_trial.number
    assert sweep["best_value"] == pytest.approx(study.best_value)
    best = next(r for r in sweep["records"] if r["number"] == sweep["best_trial"])
    weights = (platform.profile.data_root / best["folder"].split(str(platform.profile.data_root) + "/")[1]
               / "output" / "model.safetensors")
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == record["checkpoint"]["sha256"]
    # The registered model trained with the best trial's parameters, monitoring the objective.
    config = record["training"]["config"]
    assert config["train"]["lr"] == pytest.approx(best["params"]["train.lr"])
    assert config["model"]["kwargs"]["hidden_sizes"] == best["params"]["model.hidden_sizes"]
    assert config["validation"]["metric"] == "loss"

    # The UI: the checkpoint's materialization holds the trials table and the objective plot.
    (mat,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path[-1] == "checkpoint"]
    meta = mat.materialization.metadata
    assert len(meta["sweep_trials"].value.records) == 3
    assert meta["sweep_objective"].value.startswith("![objective per trial](data:image/png;base64,")
    assert meta["sweep_best_trial"].value == sweep["best_trial"]
