"""Invalid pipeline definitions fail when definitions load, naming the pipeline and field."""

import pytest

from core.spec import PipelineDefinitionError, PipelineSpec, Recipe, Source, Split


def _spec(**kw):
    args = dict(name="toy", source=Source(paths=("x.csv",)), feature_columns=("a", "b"), label_column="y",
                class_names=("0", "1"))
    args.update(kw)
    return PipelineSpec(**args)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"name": "Bad-Name"}, "name"),
        ({"source": Source()}, "source"),
        ({"feature_columns": ()}, "feature_columns"),
        ({"feature_columns": ("a", "a")}, "feature_columns"),
        ({"label_column": "a"}, "label_column"),
        ({"class_names": ("0",)}, "class_names"),
        ({"split": Split(train=0.5, validation=0.1, test=0.1)}, "split"),
        ({"split": Split(samples_per_shard=0)}, "split.samples_per_shard"),
        ({"split": Split(shard_mb=0)}, "split.shard_mb"),
        ({"feature_shape": (3,)}, "feature_shape"),
        ({"recipe": Recipe(epochs=0)}, "recipe.epochs"),
        ({"model": "no_such_model"}, "model"),
        ({"model": "pkg.module:"}, "model"),
    ],
)
def test_invalid_definitions_name_pipeline_and_field(kw, field):
    with pytest.raises(PipelineDefinitionError, match=rf"pipeline '.*', field '{field}'"):
        _spec(**kw)


def test_valid_spec_shape_defaults_to_feature_count():
    assert _spec().shape == (2,)


def test_shards_are_sized_in_bytes_unless_a_count_is_given():
    from assets.sharding import sample_bytes

    four_kb = sample_bytes((1024,))  # 1,024 float32 features and an int64 label
    assert four_kb == 4104
    assert Split().shard_samples(four_kb) == 64 * 2**20 // four_kb == 16352
    assert Split(shard_mb=1).shard_samples(four_kb) == 255
    assert Split(shard_mb=0.001).shard_samples(four_kb) == 1  # a sample bigger than the target: one per shard
    assert Split(samples_per_shard=64).shard_samples(four_kb) == 64


def test_model_import_path_is_accepted_and_resolved_by_the_runtime():
    path = "tests.runtime.user_model:tiny_linear"
    assert _spec(model=path).model == path


@pytest.mark.parametrize("kw, field, says", [
    # Import paths: the module must exist (found, not imported: definitions never import torch).
    ({"model": "no_such_pkg.nets:factory"}, "model", "no module 'no_such_pkg.nets' can be imported"),
    ({"train": "no_such_pkg.loops:main"}, "train", "no module 'no_such_pkg.loops'"),
    ({"train": "not an import path"}, "train", "must look like 'package.module:function'"),
    ({"task": "no_such_pkg.tasks:Mine"}, "task", "no module 'no_such_pkg.tasks'"),
    # Quality gates: any metric of the task, as <split>_<metric>, with min and/or max.
    ({"gate": {"test_perplexity": {"max": 12}}}, "gate.test_perplexity", "task 'classification' does not produce 'perplexity'"),
    ({"gate": {"perplexity": {"max": 12}}}, "gate.perplexity", "<split>_<metric>"),
    ({"gate": {"test_accuracy": {"above": 0.9}}}, "gate.test_accuracy", "'min': number"),
    ({"task": "regression", "classes": [], "gate": {"test_accuracy": {"min": 0.9}}}, "gate.test_accuracy",
     "task 'regression' does not produce 'accuracy'"),
    ({"recipe": {"monitor": "perplexity"}}, "recipe.monitor", "not a metric of task 'classification'"),
    ({"recipe": {"early_stopping_patience": 0}}, "recipe.early_stopping_patience", "at least 1"),
    ({"recipe": {"augment_hflip": True}}, "recipe.augment_hflip", "not an image folder"),
])
def test_training_code_gates_and_validation_are_checked_when_definitions_load(kw, field, says):
    args = dict(source="x.csv", features=["a"], label="y", classes=[0, 1]) | kw
    with pytest.raises(PipelineDefinitionError, match=rf"pipeline 'api', field '{field}'") as err:
        model_pipeline("api", **args)
    assert says in str(err.value)


def test_gates_on_any_metric_are_kept_and_checked_against_the_evaluation():
    spec = model_pipeline("api", source="x.csv", features=["a"], label="y", task="regression",
                          gate={"test_r2": {"min": 0.5}, "validation_mae": {"max": 40}})
    assert spec.gate.all_bounds() == {"test_r2": {"min": 0.5}, "validation_mae": {"max": 40}}
    ok = {"test": {"r2": 0.6}, "validation": {"mae": 30.0}}
    assert spec.gate.failures(ok) == []
    bad = {"test": {"r2": 0.4}, "validation": {}}
    assert spec.gate.failures(bad) == ["test r2 0.4000 is below the gate's minimum 0.5",
                                       "validation mae: the evaluation has no such metric (it has [])"]
    classic = model_pipeline("api", source="x.csv", features=["a"], label="y", classes=[0, 1],
                             gate={"min_test_accuracy": 0.9})
    assert classic.gate.all_bounds() == {"test_accuracy": {"min": 0.9}}


# --- shared datasets, suites, triggers, the model_pipeline API and YAML components ------------------

from core.spec import QualitySuite, Triggers, model_pipeline, resolve_shared  # noqa: E402


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"expectations": QualitySuite()}, "expectations"),
        ({"expectations": QualitySuite(raw=lambda s: {})}, "expectations"),
        ({"triggers": Triggers(cron="every monday")}, "triggers.cron"),
        ({"team": "Team A"}, "team"),
        ({"label_column": "features"}, "label_column/id_column"),  # the raw copy's feature column
        ({"source": Source(paths=("toy/*.csv",), chunk_mb=0)}, "source.chunk_mb"),
    ],
)
def test_more_invalid_definitions_name_pipeline_and_field(kw, field):
    with pytest.raises(PipelineDefinitionError, match=rf"pipeline 'toy', field '{field}'"):
        _spec(**kw)


def test_shared_dataset_takes_its_columns_from_the_owner():
    owner = _spec()
    cnn = model_pipeline("toy_cnn", dataset="toy", model="cnn", recipe={"epochs": 2})
    resolved = dict((s.name, s) for s in resolve_shared([owner, cnn]))["toy_cnn"]
    assert resolved.feature_columns == ("a", "b") and resolved.class_names == ("0", "1")
    assert resolved.dataset_name == "toy" and resolved.recipe.epochs == 2


@pytest.mark.parametrize(
    "specs, pipeline, field",
    [
        (lambda: [_spec(), _spec()], "toy", "name"),
        (lambda: [_spec(), model_pipeline("other", dataset="nope")], "other", "dataset"),
        (lambda: [model_pipeline("a", dataset="b"), model_pipeline("b", dataset="a")], "a", "dataset"),
    ],
)
def test_invalid_sharing_fails_when_definitions_load(specs, pipeline, field):
    with pytest.raises(PipelineDefinitionError, match=rf"pipeline '{pipeline}', field '{field}'"):
        resolve_shared(specs())


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"dataset": "toy", "features": ["a"]}, "feature_columns"),
        ({"dataset": "other", "source": "x.csv"}, "source"),
        ({"source": "x.csv", "features": ["a"], "label": "y", "classes": [0, 1], "recipe": {"epoch": 3}}, "recipe"),
        ({"source": "x.csv", "features": ["a"], "label": "y", "classes": [0, 1], "model": "resnet9000"}, "model"),
    ],
)
def test_model_pipeline_refuses_bad_declarations(kw, field):
    with pytest.raises(PipelineDefinitionError, match=rf"pipeline 'api', field '{field}'"):
        model_pipeline("api", **kw)


def test_yaml_declaration_with_an_unknown_model_names_pipeline_and_field():
    from pipelines.components import ModelPipelineComponent

    component = ModelPipelineComponent(name="yaml_cnn", dataset="digits", model_name="resnet9000")
    with pytest.raises(PipelineDefinitionError, match=r"pipeline 'yaml_cnn', field 'model'"):
        component.to_spec()


@pytest.mark.parametrize(
    "kw, field, says",
    [
        ({"dataset": "digits", "dataset_version": "digits-d1"}, "dataset_version", "give dataset_location too"),
        ({"dataset": "digits", "dataset_location": "vision", "dataset_version": "wine-d1"}, "dataset_version",
         "is not a version of 'digits'"),
        ({"dataset": "digits", "dataset_location": "has space"}, "dataset_location", "not a code location name"),
        ({"location": "9lives"}, "location", "not a code location name"),
    ],
)
def test_another_locations_dataset_is_declared_with_its_location_and_version(kw, field, says):
    shared = dict(source=None, feature_columns=(), label_column="", class_names=()) if "dataset" in kw else {}
    with pytest.raises(PipelineDefinitionError, match=rf"field '{field}'.*{says}"):
        _spec(**shared, **kw)


def test_dataset_location_without_a_dataset_is_refused():
    with pytest.raises(PipelineDefinitionError, match="field 'dataset_location': applies only to a pipeline that "
                                                      "trains on another pipeline's dataset"):
        _spec(dataset_location="vision")


def test_an_unknown_dataset_says_how_to_read_another_locations():
    from core.spec import model_pipeline, resolve_shared

    wide = model_pipeline("wide", dataset="digits")
    with pytest.raises(PipelineDefinitionError, match="add dataset_location='<that location>'"):
        resolve_shared([wide])
    published = model_pipeline("wide", dataset="digits", dataset_location="platform", dataset_version="digits-d3")
    assert resolve_shared([published]) == [published] and published.published_elsewhere
