"""Model registry: a small MLP, CNN and transformer encoder, plus user factories by import path."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .model_names import BUILTIN_MODELS


class MLP(nn.Module):
    def __init__(self, input_shape: Sequence[int], num_classes: int,
                 hidden_sizes: Sequence[int] = (128, 128), dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def image_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
    """[C, H, W] as is; [D] with D a perfect square as a one-channel sqrt(D) x sqrt(D) image."""
    if len(input_shape) == 3:
        return tuple(input_shape)  # type: ignore[return-value]
    if len(input_shape) == 1 and math.isqrt(input_shape[0]) ** 2 == input_shape[0]:
        s = math.isqrt(input_shape[0])
        return (1, s, s)
    if len(input_shape) == 2:
        return (1, *input_shape)  # type: ignore[return-value]
    raise ValueError(f"model 'cnn' needs feature_shape [C, H, W], [H, W] or [D] with D a perfect "
                     f"square, got {list(input_shape)}; pick another model.name")


class CNN(nn.Module):
    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: int = 32,
                 dropout: float = 0.0):
        super().__init__()
        self.shape = image_shape(input_shape)
        c = self.shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(8 * channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(x.shape[0], *self.shape)))


class TransformerClassifier(nn.Module):
    """Features as a token sequence: [L, D] is L tokens of D features; [N] is N / patch_size
    patches of patch_size features. Mean-pooled pre-norm encoder, linear head."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, d_model: int = 64,
                 nhead: int = 4, num_layers: int = 2, dim_feedforward: int = 128,
                 patch_size: int | None = None, dropout: float = 0.0):
        super().__init__()
        if len(input_shape) == 2:
            self.seq_len, token_dim = input_shape
        elif len(input_shape) == 1:
            n = input_shape[0]
            p = patch_size or next(d for d in (8, 4, 2, 1) if n % d == 0)
            if n % p:
                raise ValueError(f"model.kwargs.patch_size={p} must divide feature_shape {n}")
            self.seq_len, token_dim = n // p, p
        else:
            raise ValueError(f"model 'transformer' needs feature_shape [N] or [L, D], got {list(input_shape)}")
        if d_model % nhead:
            raise ValueError(f"model.kwargs.d_model={d_model} must be divisible by nhead={nhead}")
        self.token_dim = token_dim
        self.embed = nn.Linear(token_dim, d_model)
        self.pos = nn.Parameter(torch.zeros(1, self.seq_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
                                       batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(x.shape[0], self.seq_len, self.token_dim)) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h).mean(dim=1))


REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP, "cnn": CNN, "transformer": TransformerClassifier,
}
assert sorted(REGISTRY) == list(BUILTIN_MODELS), "model_names.BUILTIN_MODELS must list REGISTRY's names"


def resolve_factory(name: str) -> Callable[..., nn.Module]:
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" not in name:
        raise ValueError(f"model.name {name!r} is unknown; use one of {sorted(REGISTRY)} or an "
                         "import path 'pkg.module:factory'")
    module, _, attr = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"model.name {name!r} cannot be imported ({e}); check the import path") from e
    if not callable(factory):
        raise ValueError(f"model.name {name!r} is not callable")
    return factory


def build_model(name: str, input_shape: Sequence[int], num_classes: int, **kwargs) -> nn.Module:
    """Build a model by registry name or 'pkg.module:factory'. Raises ValueError naming
    model.name / model.kwargs when the model or its arguments are wrong."""
    factory = resolve_factory(name)
    try:
        inspect.signature(factory).bind(input_shape=list(input_shape), num_classes=num_classes, **kwargs)
    except TypeError as e:
        raise ValueError(f"model.kwargs {kwargs} do not fit model {name!r}: {e}") from e
    except ValueError:
        pass  # builtins without an introspectable signature: let the call report
    model = factory(input_shape=list(input_shape), num_classes=num_classes, **kwargs)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.name {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def shardable_submodules(model: nn.Module) -> list[nn.Module]:
    """Modules FSDP shards as their own units: the transformer layers when there are any,
    otherwise the convolutions and linear layers. The root takes the rest."""
    layers = [m for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)]
    if layers:
        return layers
    return [m for m in model.modules() if m is not model and isinstance(m, (nn.Conv2d, nn.Linear))]
