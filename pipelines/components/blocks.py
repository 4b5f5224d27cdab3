"""The building blocks a team declares in ``defs.yaml``, each becoming one PipelineSpec.

- ``DatasetBlock``: a dataset alone (raw_dataset -> shards), ``dataset_pipeline(...)``.
- ``TrainingBlock``: a model trained on a dataset block of this location, or on a dataset another
  team's code location publishes, ``model_pipeline(name, dataset=..., ...)``.
- ``ModelPipelineComponent``: a whole pipeline at once (its own data, or another's shards).

Errors in a block loaded from YAML name the file, the line and the field (located.py).
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from dataclasses import fields
from typing import Any, Sequence

import dagster as dg
from pydantic import Field, PrivateAttr, TypeAdapter, ValidationError

from core.placement import Placement
from core.spec import (
    Guards,
    PipelineDefinitionError,
    PipelineSpec,
    gate_from,
    QualitySuite,
    Recipe,
    Split,
    Triggers,
    dataset_pipeline,
    model_pipeline,
)
from pipelines.components.graph import PLATFORM_DEFS_MODULE, block_definitions, check_dataset_source
from pipelines.components.located import YamlSource, errors_located
from pipelines.components.scaffold import BlockScaffolder
from pipelines.models import PIPELINES
from pipelines.profiles import Profile

# PipelineSpec fields that blocks spell differently in YAML (as model_pipeline's arguments do).
_YAML_KEY_OF_SPEC_FIELD = {"feature_columns": "features", "label_column": "label", "class_names": "classes",
                           "model": "model_name", "label_column/id_column": "label"}

_RECIPE_HELP = ("Training recipe: epochs, batch_size (global), lr, optimizer, weight_decay, lr_schedule, "
                "warmup_steps, grad_accum_steps, seed, world_size (processes per node), nnodes, min_nodes (an elastic "
                "gang's fewest nodes), sharding, "
                "precision, fsdp_units (module class names that FSDP shards as units), fsdp_unit_params, "
                "activation_checkpointing, checkpoint_every_steps, keep_last_checkpoints, async_checkpoint, max_restarts. "
                "GPUs: gpus_per_node, nnodes, gpu_resource_name (a MIG profile such as nvidia.com/mig-1g.10gb); "
                "where the pods run is the placement section.")
_SWEEP_HELP = ("A search run whenever the pipeline trains (core/sweep.py): space (train.<field> or "
               "model.<kwarg>: a list of values, or {low, high, log, integer, step}), objective (a validation "
               "metric), direction, trials, parallelism, sampler (tpe, random, grid), pruner (median, "
               "successive_halving, none). The best trial is evaluated and registered.")
_GUARDS_HELP = ("What watches the training, the built-in trainer and a train function alike: hang_timeout_s "
                "(no step for this long: stacks printed, the attempt retried; below recipe.collective_timeout_s; "
                "null: off), nonfinite_skip_batches (0: a non-finite loss stops the run, not retried), "
                "loss_spike_factor, loss_spike_window, straggler_factor, straggler_window, straggler_min_excess_s, "
                "data_stall_share, data_stall_min_wait_s, gpu_max_temperature_c, repeat_after_intervals, enabled. "
                "Each is described in "
                "training_runtime/config.py (GuardsConfig).")
_PLACEMENT_HELP = ("Where training pods run on Kubernetes (core/placement.py): node_selector, tolerations, "
                   "affinity (as in a pod spec), priority_class (default: the chart's training class for "
                   "scheduled and new-data runs, its ad-hoc class otherwise), cpu, memory, shm (fixed pod "
                   "sizes, e.g. for CPU-only pods).")


def _field_error(pipeline: str, field_name: str, problem: str) -> PipelineDefinitionError:
    # core.spec's wording, so located.py finds the field whichever layer raised
    return PipelineDefinitionError(f"pipeline {pipeline!r}, field {field_name!r}: {problem}")


def _imported(pipeline: str, field_name: str, path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise _field_error(pipeline, field_name, f"cannot import {path!r} ({exc}); "
                           "use 'package.module:attribute'") from exc


def _suite(pipeline: str, path: str | None) -> QualitySuite | None:
    if path is None:
        return None
    suite = _imported(pipeline, "expectations", path)
    if not isinstance(suite, QualitySuite):
        raise _field_error(pipeline, "expectations", f"{path!r} is not a QualitySuite")
    return suite


def _section(pipeline: str, field_name: str, cls: type, value: dict[str, Any]) -> Any:
    """``value`` as a ``cls`` (Recipe, Guards, QualityGate, Triggers, Split), each key checked against its type.

    YAML gives strings and numbers as written; checked here, ``epochs: three`` is reported at its
    own key instead of failing inside the spec's validation, and a misspelt key is not ignored.
    """
    names = [f.name for f in fields(cls)]
    unknown = [k for k in value if k not in names]
    if unknown:
        raise _field_error(pipeline, f"{field_name}.{unknown[0]}", f"not a field of {field_name}; the fields are "
                           f"{names}")
    try:
        return TypeAdapter(cls).validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _field_error(pipeline, ".".join([field_name, *map(str, first["loc"])]), first["msg"]) from exc


def _source(pipeline: str, paths: list[str], loader: str | None) -> Any:
    if paths and loader:
        raise _field_error(pipeline, "loader", "give either source (paths/globs) or loader, not both")
    return _imported(pipeline, "loader", loader) if loader else (paths or None)


class Block(dg.Component, dg.Model, dg.Resolvable):
    """A building block declared in a defs.yaml; it becomes one PipelineSpec."""

    name: str = Field(description="Pipeline name: lowercase letters, digits, '_' (also its asset key prefix).")

    _yaml: YamlSource | None = PrivateAttr(default=None)

    @classmethod
    def load(cls, attributes: Any, context: dg.ComponentLoadContext) -> "Block":
        block = super().load(attributes, context)
        block._yaml = YamlSource.of(context)  # where errors about this block point
        return block

    @property
    def yaml_source(self) -> YamlSource | None:
        return self._yaml

    @property
    @abstractmethod
    def data_owner(self) -> str | None:
        """The pipeline of this location whose raw data and shards this block trains on, if another's."""

    @property
    @abstractmethod
    def owns_data(self) -> bool:
        """Whether this block declares its own data (raw_dataset and shards) that others may name."""

    @abstractmethod
    def _spec(self) -> PipelineSpec: ...

    def to_spec(self) -> PipelineSpec:
        """The PipelineSpec this block declares. A bad field raises PipelineDefinitionError; for a
        block loaded from YAML, a BlockDefinitionError naming the file, the line and the field."""
        with errors_located([self]):
            spec = self._spec()
            if spec.dataset is None and not spec.label_column:
                # core.spec accepts an empty label column; ingesting would then fail far from the YAML
                raise _field_error(spec.name, "label", "name the label column")
            return spec

    def yaml_key(self, spec_field: str) -> str:
        head, dot, rest = spec_field.partition(".")
        if head == "source" and getattr(self, "loader", None):
            head = "loader"
        return _YAML_KEY_OF_SPEC_FIELD.get(head, head) + dot + rest

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """This block's definitions when Dagster loads the defs folder itself.

        Every block builds only its own assets, so the blocks of one folder merge into one graph:
        a training block reads the raw data and shards its dataset block builds, and a dataset
        block's job also trains the training blocks that name it. A dataset that no block here
        builds (a Python pipeline of the platform, or another location's) appears as upstream
        assets built elsewhere. A dataset block's assets come from its own build_defs only, so a
        training block needs its dataset block's folder loaded with it, as Dagster always does.
        """
        tree = context.component_tree.get_all_components(of_type=Block)
        refuse_duplicate_name(self, tree)
        related = [b for b in tree if b is not self and (b.name == self.data_owner or b.data_owner == self.name)]
        spec, related_specs = self.to_spec(), [b.to_spec() for b in related]
        # Only the platform's own defs folder shares its code location with the Python pipelines.
        in_platform = context.defs_module_name == PLATFORM_DEFS_MODULE
        platform = [p for p in PIPELINES if p.name not in {b.name for b in tree}] if in_platform else []
        with errors_located([self, *related]):
            check_dataset_source(spec, names=[*(b.name for b in tree), *(p.name for p in platform)],
                                 datasets=[*(b.name for b in tree if b.owns_data),
                                           *(p.name for p in platform if p.dataset is None)])
            return block_definitions(spec, related_specs, platform, Profile.from_environment())


def refuse_duplicate_name(block: Block, blocks: Sequence[Block]) -> None:
    """Two blocks of one name would build the same asset keys: the first of ``blocks`` (the tree's
    order) keeps the name, a later one is refused, saying where the first is written."""
    other = next(b for b in [*blocks, block] if b.name == block.name)
    if other is block:
        return
    there = f"{other.yaml_source.file}:{other.yaml_source.line_of('name')}" if other.yaml_source else "Python"
    error = _field_error(block.name, "name", f"is also declared at {there}; each pipeline needs its own name "
                         "(pipeline names are also asset key prefixes)")
    with errors_located([block]):
        raise error


@dg.scaffold_with(BlockScaffolder)
class DatasetBlock(Block):
    """A dataset alone: raw_dataset -> shards, for training blocks (here or in other code locations)
    to name as their ``dataset``. Its job ingests, shards and trains the blocks of this location
    that name it."""

    source: list[str] = Field(default_factory=list, description="CSV/Parquet paths or globs under sources/.")
    loader: str | None = Field(default=None, description="Instead of source: 'package.module:function' "
                               "returning a DataFrame.")
    features: list[str] = Field(description="Feature columns, in the order models read them.")
    task: str = Field(default="classification", description="classification (label, classes), regression "
                      "(label: a numeric column) or multilabel (labels: one 0/1 column per label).")
    label: str = Field(default="", description="Label column (classification), or target column (regression).")
    classes: list[str | int] = Field(default_factory=list, description="Class names (classification: at least two).")
    labels: list[str] = Field(default_factory=list, description="Multilabel: the 0/1 column of each label.")
    target_range: list[float] | None = Field(default=None, description="Regression: [low, high] every target "
                                             "must lie in.")
    id_column: str | None = Field(default=None, description="Unique id column (split key).")
    feature_shape: list[int] | None = Field(default=None, description="Shape of one sample's features, e.g. "
                                            "[8, 8]; default: [number of features].")
    expectations: str | None = Field(default=None, description="'package.module:attribute' of a QualitySuite; "
                                     "default: QualitySuite.standard().")
    split: dict[str, Any] = Field(default_factory=dict, description="Split seed and fractions, shard size: "
                                  "seed, train, validation, test, shard_mb, samples_per_shard.")
    triggers: dict[str, Any] = Field(default_factory=dict, description="When its job runs: cron, timezone, "
                                     "on_new_data, sensor_interval_s, active.")
    team: str = Field(default="ml", description="Team, for queue limits.")
    description: str = Field(default="", description="One line for the UI.")

    @property
    def data_owner(self) -> str | None:
        return None

    @property
    def owns_data(self) -> bool:
        return True

    def _spec(self) -> PipelineSpec:
        n = self.name
        return dataset_pipeline(
            n, source=_source(n, self.source, self.loader), features=self.features, task=self.task,
            label=self.label, classes=self.classes, labels=self.labels, target_range=self.target_range,
            id_column=self.id_column,
            expectations=_suite(n, self.expectations),
            triggers=_section(n, "triggers", Triggers, self.triggers), feature_shape=self.feature_shape,
            split=_section(n, "split", Split, self.split), team=self.team, description=self.description)


@dg.scaffold_with(BlockScaffolder)
class TrainingBlock(Block):
    """A model trained on a dataset declared elsewhere: a dataset block of this location, or (with
    ``dataset_location``) a dataset another team's code location publishes on main."""

    dataset: str = Field(description="The dataset to train on: a dataset block (or pipeline) of this location, "
                         "or with dataset_location one another code location publishes.")
    dataset_location: str | None = Field(default=None, description="The code location that publishes the "
                                         "dataset, when it is another team's.")
    dataset_version: str | None = Field(default=None, description="With dataset_location: pin one published "
                                        "version, '<dataset>-d<N>'; default: the newest.")
    model_name: str = Field(description="Registry name (mlp, cnn, transformer) or 'package.module:factory'.")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="Model constructor arguments.")
    recipe: dict[str, Any] = Field(default_factory=dict, description=_RECIPE_HELP)
    guards: dict[str, Any] = Field(default_factory=dict, description=_GUARDS_HELP)
    placement: dict[str, Any] = Field(default_factory=dict, description=_PLACEMENT_HELP)
    sweep: dict[str, Any] | None = Field(default=None, description=_SWEEP_HELP)
    gate: dict[str, Any] = Field(default_factory=dict, description="Quality gate: bounds on evaluation metrics, "
                                 "e.g. test_accuracy: {min: 0.9} or test_perplexity: {max: 12}.")
    task: str = Field(default="classification", description="What the model learns: classification, regression, "
                      "multilabel, language_modeling (the dataset's task), or 'package.module:TaskClass'.")
    train: str | None = Field(default=None, description="'package.module:function' run on every rank with a "
                              "TrainingContext instead of the built-in training loop.")
    triggers: dict[str, Any] = Field(default_factory=dict, description="When it retrains on its own: cron, "
                                     "timezone, on_new_data, sensor_interval_s, active (the dataset block's "
                                     "job trains it too).")
    team: str = Field(default="ml", description="Team, for queue limits.")
    description: str = Field(default="", description="One line for the UI.")

    @property
    def data_owner(self) -> str | None:
        return None if self.dataset_location else self.dataset

    @property
    def owns_data(self) -> bool:
        return False

    def _spec(self) -> PipelineSpec:
        n = self.name
        return model_pipeline(
            n, dataset=self.dataset, dataset_location=self.dataset_location, dataset_version=self.dataset_version,
            model=self.model_name, model_kwargs=self.model_kwargs, recipe=_section(n, "recipe", Recipe, self.recipe),
            gate=gate_from(n, self.gate), triggers=_section(n, "triggers", Triggers, self.triggers),
            team=self.team, description=self.description, task=self.task, train=self.train,
            placement=_section(n, "placement", Placement, self.placement), sweep=self.sweep,
            guards=_section(n, "guards", Guards, self.guards))


@dg.scaffold_with(BlockScaffolder)
class ModelPipelineComponent(Block):
    """One whole model pipeline: raw dataset -> shards -> checkpoint -> model version, declared in YAML."""

    source: list[str] = Field(default_factory=list, description="CSV/Parquet paths or globs under sources/.")
    loader: str | None = Field(default=None, description="'package.module:function' returning a DataFrame.")
    dataset: str | None = Field(default=None, description="Train on this other pipeline's shards instead.")
    features: list[str] = Field(default_factory=list, description="Feature columns.")
    label: str = Field(default="", description="Label column (classification), or target column (regression).")
    classes: list[str | int] = Field(default_factory=list, description="Known class names.")
    labels: list[str] = Field(default_factory=list, description="Multilabel: the 0/1 column of each label.")
    target_range: list[float] | None = Field(default=None, description="Regression: [low, high] of the targets.")
    id_column: str | None = Field(default=None, description="Unique id column (split key).")
    expectations: str | None = Field(default=None, description="'package.module:attribute' of a QualitySuite.")
    model_name: str = Field(default="mlp", description="Registry name (mlp, cnn, transformer) or import path.")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="Model constructor arguments.")
    recipe: dict[str, Any] = Field(default_factory=dict, description=_RECIPE_HELP)
    guards: dict[str, Any] = Field(default_factory=dict, description=_GUARDS_HELP)
    placement: dict[str, Any] = Field(default_factory=dict, description=_PLACEMENT_HELP)
    sweep: dict[str, Any] | None = Field(default=None, description=_SWEEP_HELP)
    gate: dict[str, Any] = Field(default_factory=dict, description="Quality gate: bounds on evaluation metrics, "
                                 "e.g. test_accuracy: {min: 0.9}.")
    task: str = Field(default="classification", description="classification, regression or multilabel.")
    train: str | None = Field(default=None, description="'package.module:function': your own training loop.")
    triggers: dict[str, Any] = Field(default_factory=dict, description="cron, on_new_data, active.")
    split: dict[str, Any] = Field(default_factory=dict, description="Split seed and fractions.")
    team: str = Field(default="ml", description="Team, for queue limits.")
    description: str = Field(default="", description="One line for the UI.")

    @property
    def data_owner(self) -> str | None:
        return self.dataset

    @property
    def owns_data(self) -> bool:
        return self.dataset is None

    def _spec(self) -> PipelineSpec:
        n = self.name
        return model_pipeline(
            n, source=_source(n, self.source, self.loader), dataset=self.dataset, features=self.features,
            label=self.label, classes=self.classes, labels=self.labels, target_range=self.target_range,
            id_column=self.id_column,
            expectations=_suite(n, self.expectations), model=self.model_name, model_kwargs=self.model_kwargs,
            recipe=_section(n, "recipe", Recipe, self.recipe), gate=gate_from(n, self.gate),
            triggers=_section(n, "triggers", Triggers, self.triggers),
            split=_section(n, "split", Split, self.split), team=self.team, description=self.description,
            task=self.task, train=self.train, placement=_section(n, "placement", Placement, self.placement),
            sweep=self.sweep, guards=_section(n, "guards", Guards, self.guards))


