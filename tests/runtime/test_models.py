import pytest
import torch

from training_runtime.models.builtin import build_model


@pytest.mark.parametrize("name, shape, kwargs", [
    ("mlp", [64], {}), ("mlp", [3, 4, 4], {"hidden_sizes": [8, 8], "dropout": 0.1}),
    ("cnn", [64], {"channels": 4}), ("cnn", [3, 8, 8], {"channels": 4}), ("cnn", [6, 6], {}),
    ("transformer", [64], {"d_model": 16, "nhead": 2, "num_layers": 1}),
    ("transformer", [5, 7], {"d_model": 16, "nhead": 4}),
    ("tests.runtime.user_model:tiny_linear", [12], {"bias": False}),
])
def test_models_map_features_to_logits(name, shape, kwargs):
    model = build_model(name, shape, 10, **kwargs)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 10)
    out.sum().backward()


def test_errors_name_the_setting():
    with pytest.raises(ValueError, match="model.name 'resnet9000' is unknown"):
        build_model("resnet9000", [64], 10)
    with pytest.raises(ValueError, match="model.kwargs"):
        build_model("mlp", [64], 10, width=3)
    with pytest.raises(ValueError, match="needs feature_shape"):
        build_model("cnn", [10], 10)
    with pytest.raises(ValueError, match="not a torch.nn.Module"):
        build_model("tests.runtime.user_model:not_a_module", [4], 2)
    with pytest.raises(ValueError, match="d_model=10 must be divisible by nhead=4"):
        build_model("transformer", [64], 10, d_model=10)


def test_the_torch_free_list_of_model_names_matches_the_registry():
    from training_runtime.models.names import BUILTIN_MODELS
    from training_runtime.models.builtin import REGISTRY

    assert sorted(REGISTRY) == list(BUILTIN_MODELS)
