"""Invalid pipeline definitions fail when definitions load, naming the pipeline and field."""

import pytest

from assets.spec import PipelineDefinitionError, PipelineSpec, Recipe, Source, Split


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


def test_model_import_path_is_accepted_and_resolved_by_the_runtime():
    assert _spec(model="pkg.module:factory").model == "pkg.module:factory"
