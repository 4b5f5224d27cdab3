"""Building a model for the data it trains on: the factory gets the model-facing input shape and
the task's number of outputs, and, for token data, the vocabulary and padding id when its
signature takes them. The same arguments go into the model card, so serving rebuilds the model
exactly as training did."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from training_runtime.data.info import DataInfo
from training_runtime.models.builtin import build_model, resolve_factory

# Facts of the data a token model may need that the model kwargs do not carry.
_DATA_KWARGS = ("vocab_size", "pad_id")


@dataclass(frozen=True)
class ModelBuild:
    """Everything ``build_model`` is called with."""

    factory: str
    kwargs: dict[str, Any]
    input_shape: list[int]
    num_outputs: int
    extra_kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> nn.Module:
        return build_model(self.factory, self.input_shape, self.num_outputs, **self.kwargs, **self.extra_kwargs)

    def to_card(self) -> dict[str, Any]:
        return {"factory": self.factory, "kwargs": dict(self.kwargs), "input_shape": list(self.input_shape),
                "num_outputs": self.num_outputs, "extra_kwargs": dict(self.extra_kwargs)}


def model_build(factory: str, kwargs: dict[str, Any], info: DataInfo, num_outputs: int) -> ModelBuild:
    """The build of ``factory`` for this data. Data facts are passed only to a factory that names
    them (or takes ``**kwargs``) and only when the user did not set them in ``kwargs``."""
    extra: dict[str, Any] = {}
    if info.kind == "text":
        params = inspect.signature(resolve_factory(factory)).parameters
        open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        facts = {"vocab_size": info.vocab_size, "pad_id": info.pad_id}
        for name in _DATA_KWARGS:
            if name not in kwargs and facts[name] is not None and (name in params or open_kwargs):
                extra[name] = facts[name]
    return ModelBuild(factory=factory, kwargs=dict(kwargs), input_shape=info.model_input_shape(),
                      num_outputs=num_outputs, extra_kwargs=extra)


def check_builds(build: ModelBuild) -> None:
    """Raise ValueError when the model cannot be built with these arguments. Built-in models are
    built on the meta device (no memory, no init); user factories get their arguments bound."""
    from training_runtime.models.names import BUILTIN_MODELS

    if build.factory in BUILTIN_MODELS:
        with torch.device("meta"):
            build.build()
    else:
        try:
            inspect.signature(resolve_factory(build.factory)).bind(
                input_shape=build.input_shape, num_classes=build.num_outputs, **build.kwargs, **build.extra_kwargs)
        except TypeError as e:
            raise ValueError(str(e)) from e
