"""Overrides and sweep declarations: parsed, applied and refused with the field named, before
anything runs."""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest

from core.experiment_lineage import experiment_rows, overrides_summary, sweep_summary, trial_line
from core.lineage import LineageRow
from core.overrides import (
    OverrideError, apply_overrides, override_record, overrides_config_schema, overrides_tag, parse_set,
    recipe_field_docs, recipe_field_types)
from core.spec import PipelineDefinitionError, Recipe, model_pipeline
from core.sweep import (
    Choice, FloatRange, IntRange, LogRange, Range, Sweep, check_sweep_capacity, direction_of, grid_of, grid_size)
from pipelines.components import TrainingBlock
from pipelines.models.wine import wine_pipeline

TABLE = dict(source="x.csv", features=["a", "b"], label="y", classes=["p", "q"])


def pipeline(**kw):
    return model_pipeline("m", **TABLE, **kw)


# --- overrides -----------------------------------------------------------------------------------
def test_set_items_parse_as_json_values_into_sections():
    assert parse_set(["train.lr=0.005", "train.optimizer=sgd", "train.keep_best=false",
                      "model.hidden_sizes=[64, 32]", "gate.test_accuracy.min=0.9", "train.monitor=null"]) == {
        "train": {"lr": 0.005, "optimizer": "sgd", "keep_best": False, "monitor": None},
        "model": {"hidden_sizes": [64, 32]}, "gate": {"test_accuracy": {"min": 0.9}}}
    for bad, says in (("lr=1", "write <section>.<field>=<value>"), ("train.lr", "write <section>"),
                      ("recipe.lr=1", "'recipe' is not a section")):
        with pytest.raises(OverrideError, match=says):
            parse_set([bad])


def test_overrides_apply_and_are_recorded_as_pipeline_and_run_values():
    spec = pipeline(recipe={"lr": 0.01, "epochs": 5}, model_kwargs={"hidden_sizes": [32]},
                    gate={"min_test_accuracy": 0.8})
    overrides = parse_set(["train.lr=0.02", "train.epochs=5", "model.hidden_sizes=[8]",
                           "gate.test_accuracy.min=0.5", "train.grad_clip_norm=1"])
    run = apply_overrides(spec, overrides)
    assert (run.recipe.lr, run.recipe.epochs, run.recipe.grad_clip_norm) == (0.02, 5, 1.0)  # int -> float field
    assert run.model_kwargs == {"hidden_sizes": [8]} and run.gate.all_bounds() == {"test_accuracy": {"min": 0.5}}
    assert spec.recipe.lr == 0.01  # the pipeline itself is unchanged
    record = override_record(spec, overrides)
    assert record == {"gate.test_accuracy.min": {"pipeline": 0.8, "run": 0.5},
                      "model.hidden_sizes": {"pipeline": [32], "run": [8]},
                      "train.grad_clip_norm": {"pipeline": None, "run": 1},
                      "train.lr": {"pipeline": 0.01, "run": 0.02}}  # epochs=5 changes nothing: not listed
    assert overrides_tag(record) == ('gate.test_accuracy.min=0.5 model.hidden_sizes=[8] train.grad_clip_norm=1 '
                                     'train.lr=0.02')
    assert apply_overrides(spec, {}) is spec
    # A gate bound is dropped by null.
    assert apply_overrides(spec, parse_set(["gate.test_accuracy.min=null"])).gate.all_bounds() == {}


@pytest.mark.parametrize("items, says", [
    (["train.lr=-1"], "pipeline 'm', field 'recipe.lr': must be positive"),  # the pipeline's own message
    (["train.epochs=0"], "field 'recipe.epochs': must be at least 1"),
    (["train.epochs=2.5"], "override train.epochs: 2.5 is not a int"),
    (["train.keep_best=1"], "override train.keep_best: 1 is not a bool"),
    (["train.lr=null"], "override train.lr: cannot be null"),
    (["train.nope=1"], "the recipe has no field 'nope'"),
    (["train.monitor=perplexity"], "field 'recipe.monitor': 'perplexity' is not a metric of task"),
    (["gate.test_perplexity.max=3"], "field 'gate.test_perplexity': task 'classification' does not produce"),
    (["gate.accuracy.min=0.5"], "field 'gate.accuracy': name a metric as <split>_<metric>"),
])
def test_a_bad_override_fails_with_the_field_named(items, says):
    with pytest.raises(OverrideError, match=says.replace("(", r"\(").replace(")", r"\)")):
        apply_overrides(pipeline(), parse_set(items))


def test_every_recipe_field_is_overridable_with_a_described_launchpad_field():
    types = recipe_field_types()
    assert set(types) == {f.name for f in dataclasses.fields(Recipe)}
    assert types["lr"] == (float, False) and types["monitor"] == (str, True) and types["compile"] == (bool, False)
    docs = recipe_field_docs()
    assert docs["cpu_per_gpu"].startswith("CPU cores per GPU") and docs["lr"] == "peak learning rate"

    schema = overrides_config_schema(wine_pipeline)
    def overrides(context):
        return None

    op = dg.op(config_schema=schema)(overrides)
    fields = op.config_schema.config_type.fields
    train = fields["train"].config_type.fields
    assert set(train) == set(types) and not any(f.is_required for f in train.values())
    assert train["lr"].description == "Peak learning rate. The pipeline says 0.01."
    assert "hidden_sizes" in fields["model"].config_type.fields
    assert set(fields["gate"].config_type.fields) == {"test_accuracy"}
    # Dagster validates run config against it, as the Launchpad does.
    from dagster._config import process_config

    assert process_config(op.config_schema.config_type, {"train": {"lr": 0.005, "seed": 1}}).success
    assert not process_config(op.config_schema.config_type, {"train": {"lr": "fast"}}).success
    assert not process_config(op.config_schema.config_type, {"train": {"lrr": 1}}).success


# --- sweeps --------------------------------------------------------------------------------------
def test_a_sweep_in_python_and_in_yaml_is_the_same_declaration():
    python = pipeline(sweep=Sweep(space={"train.lr": LogRange(1e-3, 1e-1), "train.batch_size": Choice(16, 32),
                                         "train.epochs": IntRange(2, 8, step=2)}, objective="accuracy"))
    yaml = pipeline(sweep={"space": {"train.lr": {"low": 1e-3, "high": 1e-1, "log": True},
                                     "train.batch_size": [16, 32],
                                     "train.epochs": {"low": 2, "high": 8, "integer": True, "step": 2}},
                           "objective": "accuracy"})
    assert python.sweep == yaml.sweep
    assert direction_of(python) == "maximize"  # the task's own direction for accuracy
    assert direction_of(pipeline(sweep=Sweep(space={"train.lr": LogRange(1e-3, 1e-1)}, objective="loss"))) \
        == "minimize"
    block = TrainingBlock(name="t", dataset="wine", model_name="mlp",
                          sweep={"space": {"model.hidden_sizes": [[16], [32]]}, "objective": "loss", "trials": 4})
    assert block.to_spec().sweep.space["model.hidden_sizes"] == Choice([16], [32])


@pytest.mark.parametrize("sweep, field, says", [
    (dict(space={"train.lr": Range(low=0.1, high=0.01)}), "sweep.space.train.lr", "is inverted"),
    (dict(space={"train.lr": Range(low=0.1, high=0.1)}), "sweep.space.train.lr", "is empty"),
    (dict(space={"train.lr": Range(low=0.0, high=0.1, log=True)}), "sweep.space.train.lr", "log range needs low > 0"),
    (dict(space={"train.epochs": FloatRange(1, 3)}), "sweep.space.train.epochs", "use IntRange"),
    (dict(space={"train.optimizer": FloatRange(1, 3)}), "sweep.space.train.optimizer", "search it with a Choice"),
    (dict(space={"train.lr": Choice()}), "sweep.space.train.lr", "the choice is empty"),
    (dict(space={}), "sweep.space", "is empty"),
    (dict(space={"lr": Choice(1)}), "sweep.space.lr", "name a recipe field as train.<field>"),
    (dict(space={"train.nope": Choice(1)}), "sweep.space.train.nope", "the recipe has no field 'nope'"),
    (dict(space={"train.lr": LogRange(1e-3, 1e-1)}, objective="perplexity"), "sweep.objective",
     "'perplexity' is not a validation metric of task 'classification'"),
    (dict(space={"train.lr": LogRange(1e-3, 1e-1)}, trials=2, parallelism=3), "sweep.parallelism", "exceeds"),
    (dict(space={"train.lr": LogRange(1e-3, 1e-1)}, sampler="grid"), "sweep.space.train.lr", "finite grid"),
    (dict(space={"train.lr": LogRange(1e-3, 1e-1)}, pruner="asha"), "sweep.pruner", "use one of"),
    (dict(space={"train.lr": LogRange(1e-3, 1e-1)}, trials=0), "sweep.trials", "at least 1"),
])
def test_a_bad_sweep_is_refused_at_definition_load_with_the_field_named(sweep, field, says):
    sweep = {"objective": "loss", **sweep}
    with pytest.raises(PipelineDefinitionError, match=rf"field '{field}': .*{says}"):
        pipeline(sweep=Sweep(**sweep))


def test_parallel_trials_must_fit_the_gpu_pool():
    spec = pipeline(recipe={"gpus_per_node": 4}, sweep=Sweep(space={"train.lr": LogRange(1e-3, 1e-1)},
                                                             objective="loss", trials=8, parallelism=3))
    check_sweep_capacity(spec, 12)
    with pytest.raises(PipelineDefinitionError, match=r"field 'sweep.parallelism': 3 trials at a time x 4 GPU\(s\) "
                                                      r"each = 12 GPUs, but the GPU pool has 8; lower parallelism "
                                                      r"to at most 2"):
        check_sweep_capacity(spec, 8)
    check_sweep_capacity(pipeline(sweep=spec.sweep), 1)  # CPU trials take no GPU units


def test_grid_values():
    space = {"train.batch_size": Choice(16, 32), "train.lr": FloatRange(0.1, 0.3, step=0.1),
             "train.epochs": IntRange(1, 3)}
    grid = grid_of(space)
    assert grid["train.batch_size"] == [16, 32] and grid["train.epochs"] == [1, 2, 3]
    assert grid["train.lr"] == pytest.approx([0.1, 0.2, 0.3]) and grid_size(space) == 18


def test_lineage_rows_list_the_overrides_and_every_trial():
    record = {"overrides": {"train.lr": {"pipeline": 0.01, "run": 0.005}},
              "sweep": {"study": "wine-r1", "objective": "loss", "direction": "minimize", "trials": 2, "complete": 1,
                        "pruned": 1, "failed": 0, "best_trial": 0, "best_value": 0.25,
                        "records": [{"number": 0, "state": "complete", "value": 0.25, "validations": 5,
                                     "params": {"train.lr": 0.01}},
                                    {"number": 1, "state": "pruned", "value": 0.9, "validations": 2, "pruned_step": 18,
                                     "params": {"train.lr": 0.09}}]}}
    rows = experiment_rows(record, LineageRow)
    assert [r.field for r in rows] == ["overrides", "sweep", "trial 0", "trial 1"]
    assert overrides_summary(record["overrides"]) == "train.lr 0.01 -> 0.005"
    assert sweep_summary(record["sweep"]).startswith("trial 0 of 2 (best validation loss 0.25, minimize; 1 complete, "
                                                     "1 pruned, 0 failed)")
    assert trial_line(record["sweep"]["records"][1]) == "#1 pruned at step 18 value 0.9 (2 validations)  train.lr=0.09"
    assert experiment_rows({"overrides": {}, "sweep": None}, LineageRow) == []


def test_the_location_refuses_a_sweep_its_gpu_pool_cannot_hold(tmp_path):
    from pipelines.assembly import location_definitions
    from pipelines.profiles import Profile, instance_gpu_pool

    (tmp_path / "dagster.yaml").write_text("concurrency:\n  pools:\n    default_limit: 2\n")
    assert instance_gpu_pool(tmp_path) == 2 and instance_gpu_pool(tmp_path / "none") is None
    profile = Profile(name="local", data_root=tmp_path / "platform", gpu_pool=2)
    sweep = Sweep(space={"train.lr": LogRange(1e-3, 1e-1)}, objective="loss", trials=4, parallelism=2)
    with pytest.raises(PipelineDefinitionError, match="field 'sweep.parallelism': 2 trials at a time x 2 GPU"):
        location_definitions("platform", [pipeline(recipe={"gpus_per_node": 2}, sweep=sweep)], profile)
    location_definitions("platform", [pipeline(recipe={"gpus_per_node": 1}, sweep=sweep)], profile)
