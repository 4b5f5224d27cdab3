"""The model pipeline as a Dagster component, so pipelines can be declared in YAML.

``pipelines/defs/<name>/defs.yaml``::

    type: pipelines.components.ModelPipelineComponent
    attributes:
      name: digits_cnn
      dataset: digits          # train on the digits pipeline's shards
      model_name: cnn
      recipe: {epochs: 3, batch_size: 32}
      gate: {min_test_accuracy: 0.5}

Each YAML pipeline becomes the same PipelineSpec ``model_pipeline(...)`` builds in Python, and
goes through the same validation when definitions load.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.pipeline import asset_keys
from core.spec import PipelineDefinitionError, PipelineSpec, QualitySuite, model_pipeline

DEFS_MODULE = "pipelines.defs"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _import(pipeline: str, field_name: str, path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise PipelineDefinitionError(
            f"pipeline {pipeline!r}, field {field_name!r}: cannot import {path!r} ({exc}); "
            "use 'package.module:attribute'") from exc


class ModelPipelineComponent(dg.Component, dg.Model, dg.Resolvable):
    """One model pipeline: raw dataset -> shards -> checkpoint -> model version, declared in YAML."""

    name: str = Field(description="Pipeline name: lowercase letters, digits, '_'.")
    source: list[str] = Field(default_factory=list, description="CSV/Parquet paths or globs under sources/.")
    loader: str | None = Field(default=None, description="'package.module:function' returning a DataFrame.")
    dataset: str | None = Field(default=None, description="Train on this other pipeline's shards instead.")
    features: list[str] = Field(default_factory=list, description="Feature columns.")
    label: str = Field(default="", description="Label column.")
    classes: list[str] = Field(default_factory=list, description="Known class names.")
    id_column: str | None = Field(default=None, description="Unique id column (split key).")
    expectations: str | None = Field(default=None, description="'package.module:attribute' of a QualitySuite.")
    model_name: str = Field(default="mlp", description="Registry name (mlp, cnn, transformer) or import path.")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="Model constructor arguments.")
    recipe: dict[str, Any] = Field(default_factory=dict, description="Training recipe fields (epochs, ...).")
    gate: dict[str, Any] = Field(default_factory=dict, description="Quality gate (min_test_accuracy, ...).")
    triggers: dict[str, Any] = Field(default_factory=dict, description="cron, on_new_data, active.")
    split: dict[str, Any] = Field(default_factory=dict, description="Split seed and fractions.")
    team: str = Field(default="ml", description="Team, for queue limits.")
    description: str = Field(default="", description="One line for the UI.")

    def to_spec(self) -> PipelineSpec:
        source: Any = self.source or None
        if self.loader:
            source = _import(self.name, "loader", self.loader)
        suite = _import(self.name, "expectations", self.expectations) if self.expectations else None
        if suite is not None and not isinstance(suite, QualitySuite):
            raise PipelineDefinitionError(f"pipeline {self.name!r}, field 'expectations': "
                                          f"{self.expectations!r} is not a QualitySuite")
        return model_pipeline(
            self.name, source=source, dataset=self.dataset, features=self.features, label=self.label,
            classes=self.classes, id_column=self.id_column, expectations=suite, model=self.model_name,
            model_kwargs=self.model_kwargs, recipe=self.recipe, gate=self.gate, triggers=self.triggers,
            split=self.split or None, team=self.team, description=self.description)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from pipelines.assembly import pipeline_definitions
        from pipelines.models import PIPELINES
        from pipelines.profiles import Profile

        spec = self.to_spec()
        profile = Profile.from_environment()
        # Loaded on its own, a shared-dataset pipeline sees its owner's data as upstream assets
        # produced elsewhere (the owner's own definitions materialize them).
        upstream = [dg.AssetSpec(k, description=f"Produced by the {spec.dataset} pipeline.")
                    for k in (asset_keys(spec.dataset).values() if spec.dataset else ())
                    if k.path[-1] in ("raw_dataset", "shards")]
        return dg.Definitions.merge(
            pipeline_definitions([spec], owners=[p for p in PIPELINES if p.name == spec.dataset]),
            dg.Definitions(assets=upstream, resources=profile.resources(), executor=profile.executor()))


def load_component_tree(defs_module: str = DEFS_MODULE, project_root: Path = REPO_ROOT) -> dg.ComponentTree:
    return dg.ComponentTree.from_module(defs_module=importlib.import_module(defs_module), project_root=project_root)


def yaml_pipelines(defs_module: str = DEFS_MODULE, project_root: Path = REPO_ROOT) -> list[PipelineSpec]:
    """The specs of every ModelPipelineComponent declared under ``defs_module``."""
    tree = load_component_tree(defs_module, project_root)
    return [c.to_spec() for c in tree.get_all_components(of_type=ModelPipelineComponent)]
