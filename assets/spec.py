"""The declarative description of one model pipeline: what data, which model, how to train,
what counts as good enough, and when to retrain. Validated when definitions load."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class PipelineDefinitionError(ValueError):
    """A pipeline definition that cannot work, found when definitions load."""


def _fail(pipeline: str, field_name: str, problem: str) -> None:
    raise PipelineDefinitionError(f"pipeline {pipeline!r}, field {field_name!r}: {problem}")


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where a pipeline's raw data comes from: CSV/Parquet files, or a loader returning a frame."""

    paths: tuple[str, ...] = ()  # files or glob patterns; relative ones resolve against the sources root
    loader: Callable[[], pd.DataFrame] | None = None
    csv_options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.loader is not None:
            return f"loader {self.loader.__module__}.{getattr(self.loader, '__qualname__', 'loader')}"
        return ", ".join(self.paths)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How to train: handed to training_runtime as its config."""

    epochs: int = 10
    batch_size: int = 64
    lr: float = 0.01
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    grad_accum_steps: int = 1
    seed: int = 0
    world_size: int = 2  # worker processes per node (torchrun --nproc-per-node)
    nnodes: int = 1
    sharding: str = "ddp"
    precision: str = "fp32"
    checkpoint_every_steps: int = 50
    keep_last_checkpoints: int = 3
    async_checkpoint: bool = False
    max_restarts: int = 1
    gpus_per_node: int = 0
    gpu_resource_name: str = "nvidia.com/gpu"


@dataclass(frozen=True, kw_only=True)
class QualityGate:
    """A model version is published to main only when it meets every threshold."""

    min_test_accuracy: float = 0.0
    max_test_loss: float | None = None

    def failures(self, metrics: dict[str, float]) -> list[str]:
        out = []
        if metrics["accuracy"] < self.min_test_accuracy:
            out.append(f"test accuracy {metrics['accuracy']:.4f} is below the gate's minimum {self.min_test_accuracy}")
        if self.max_test_loss is not None and metrics["loss"] > self.max_test_loss:
            out.append(f"test loss {metrics['loss']:.4f} is above the gate's maximum {self.max_test_loss}")
        return out


@dataclass(frozen=True, kw_only=True)
class Split:
    seed: int = 0
    train: float = 0.8
    validation: float = 0.1
    test: float = 0.1
    samples_per_shard: int = 512


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    name: str
    source: Source
    feature_columns: tuple[str, ...]
    label_column: str
    class_names: tuple[str, ...]
    id_column: str | None = None
    model: str = "mlp"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    recipe: Recipe = field(default_factory=Recipe)
    gate: QualityGate = field(default_factory=QualityGate)
    split: Split = field(default_factory=Split)
    feature_shape: tuple[int, ...] | None = None  # defaults to (len(feature_columns),)
    description: str = ""

    def __post_init__(self) -> None:
        n = self.name
        if not isinstance(n, str) or not _NAME.match(n):
            _fail(str(n), "name", "use 1-63 lowercase letters, digits and '_', starting with a letter")
        if not self.source.paths and self.source.loader is None:
            _fail(n, "source", "give file paths/globs (CSV or Parquet) or a loader function")
        if not self.feature_columns:
            _fail(n, "feature_columns", "list at least one feature column")
        if len(set(self.feature_columns)) != len(self.feature_columns):
            _fail(n, "feature_columns", "a column is listed twice")
        if self.label_column in self.feature_columns:
            _fail(n, "label_column", f"{self.label_column!r} is also a feature column")
        if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
            _fail(n, "class_names", "give at least two distinct class names")
        fractions = (self.split.train, self.split.validation, self.split.test)
        if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
            _fail(n, "split", f"train/validation/test fractions must be positive and sum to 1, got {fractions}")
        if self.split.samples_per_shard < 1:
            _fail(n, "split.samples_per_shard", "must be at least 1")
        if self.feature_shape is not None:
            size = 1
            for d in self.feature_shape:
                size *= d
            if size != len(self.feature_columns):
                _fail(n, "feature_shape", f"{self.feature_shape} holds {size} values but there are "
                      f"{len(self.feature_columns)} feature columns")
        r = self.recipe
        for fname in ("epochs", "batch_size", "world_size", "nnodes", "grad_accum_steps", "checkpoint_every_steps",
                      "keep_last_checkpoints"):
            if getattr(r, fname) < 1:
                _fail(n, f"recipe.{fname}", "must be at least 1")
        if r.lr <= 0:
            _fail(n, "recipe.lr", "must be positive")
        if not 0.0 <= self.gate.min_test_accuracy <= 1.0:
            _fail(n, "gate.min_test_accuracy", "must lie between 0 and 1")
        _check_model_name(n, self.model)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.feature_shape or (len(self.feature_columns),)


def _check_model_name(pipeline: str, model: str) -> None:
    from training_runtime.models import REGISTRY  # plain PyTorch; no dagster

    if ":" in model:
        module, _, attr = model.partition(":")
        if not module or not attr:
            _fail(pipeline, "model", f"import path {model!r} must look like 'package.module:factory'")
        return
    if model not in REGISTRY:
        _fail(pipeline, "model", f"unknown model {model!r}; choose one of {sorted(REGISTRY)} "
              "or give an import path 'package.module:factory'")
