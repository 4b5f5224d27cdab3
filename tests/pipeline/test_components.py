"""Building blocks in YAML: dataset and training blocks compose into one graph, errors point at the
YAML line, and new blocks are scaffolded from templates. Each test writes its own defs module."""

from __future__ import annotations

import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from dagster.components.component_scaffolding import scaffold_object
from dagster.components.core.component_tree import ComponentTreeException
from dagster.components.scaffold.scaffold import get_scaffolder
from pydantic import ValidationError

from core.spec import PipelineDefinitionError
from pipelines.assembly import location_definitions
from pipelines.components import (
    BlockDefinitionError,
    DatasetBlock,
    ModelPipelineComponent,
    TrainingBlock,
    load_component_tree,
    yaml_pipelines,
)
from pipelines.components.scaffold import BlockScaffolder, scaffold_block
from pipelines.components.templates import render
from pipelines.profiles import Profile

FLOWERS = """\
type: pipelines.components.DatasetBlock
attributes:
  name: flowers
  source: [flowers/*.csv]
  features: [petal_length, petal_width, sepal_length, sepal_width]
  feature_shape: [2, 2]
  label: species
  classes: [setosa, versicolor, virginica]
  split: {samples_per_shard: 16}
"""


def training_block(name: str, model: str = "mlp", more: str = "") -> str:
    return (f"type: pipelines.components.TrainingBlock\nattributes:\n  name: {name}\n  dataset: flowers\n"
            f"  model_name: {model}\n{more}")


@dataclass
class DefsModule:
    """A defs module of the test's own under tmp_path, importable while the test runs."""

    name: str
    root: Path

    @property
    def folder(self) -> Path:
        return self.root / self.name

    def write(self, block: str, text: str) -> str:
        (self.folder / block).mkdir()
        (self.folder / block / "defs.yaml").write_text(text, encoding="utf-8")
        return f"{self.name}/{block}/defs.yaml"  # as errors show it, relative to the project root

    def tree(self) -> dg.ComponentTree:
        return load_component_tree(self.name, self.root)

    def specs(self, **kw):
        return yaml_pipelines(self.name, self.root, **kw)


@pytest.fixture
def defs(tmp_path, monkeypatch):
    module = DefsModule(name=f"blocks_{uuid.uuid4().hex[:12]}", root=tmp_path)
    module.folder.mkdir()
    (module.folder / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module.name, None)


def materialized_graph(defs_: dg.Definitions) -> dict[str, list[str]]:
    """Each asset this location materializes, with its parents."""
    graph = defs_.resolve_asset_graph()
    return {k.to_user_string(): sorted(p.to_user_string() for p in graph.get(k).parent_keys)
            for k in graph.get_all_asset_keys() if graph.get(k).is_materializable}


def job_assets(defs_: dg.Definitions, job: str) -> list[str]:
    return sorted(k.to_user_string() for k in defs_.resolve_job_def(job).asset_layer.selected_asset_keys)


ONE_DATASET_TWO_MODELS = {
    "flowers/raw_dataset": [],
    "flowers/shards": ["flowers/raw_dataset"],
    **{f"{m}/checkpoint": ["flowers/shards"] for m in ("iris_cnn", "iris_mlp")},
    **{f"{m}/model_version": ["flowers/raw_dataset", "flowers/shards", f"{m}/checkpoint"]
       for m in ("iris_cnn", "iris_mlp")},
}


# --- composition ----------------------------------------------------------------------------------


@pytest.fixture
def flowers_and_two_models(defs):
    defs.write("flowers", FLOWERS)
    defs.write("iris_mlp", training_block("iris_mlp", "mlp", "  recipe: {epochs: 2}\n"))
    defs.write("iris_cnn", training_block("iris_cnn", "cnn", '  triggers: {cron: "0 4 * * 1"}\n'))
    return defs


def test_a_dataset_block_feeds_two_training_blocks_in_the_location(flowers_and_two_models, tmp_path):
    specs = flowers_and_two_models.specs(alongside=[])
    assert [(s.name, s.dataset, s.model) for s in specs] == [
        ("flowers", None, None), ("iris_cnn", "flowers", "cnn"), ("iris_mlp", "flowers", "mlp")]

    location = location_definitions("botany", specs, Profile(name="local", data_root=tmp_path / "platform"))

    assert materialized_graph(location) == ONE_DATASET_TWO_MODELS
    # the dataset's job ingests and shards once, then trains both models on that commit
    assert job_assets(location, "flowers_training") == sorted(ONE_DATASET_TWO_MODELS)
    assert job_assets(location, "iris_mlp_training") == ["iris_mlp/checkpoint", "iris_mlp/model_version"]


def test_dagster_loading_the_defs_folder_draws_the_same_graph(flowers_and_two_models):
    tree_defs = flowers_and_two_models.tree().build_defs()

    assert materialized_graph(tree_defs) == ONE_DATASET_TWO_MODELS
    assert job_assets(tree_defs, "flowers_training") == sorted(ONE_DATASET_TWO_MODELS)
    assert {s.name for s in tree_defs.schedules} == {"iris_cnn_retrain_schedule"}
    assert {s.name for s in tree_defs.sensors} == {"flowers_new_data_sensor"}


def test_a_training_block_on_another_locations_dataset_reads_it_as_published(defs):
    defs.write("iris_wide", training_block("iris_wide", more="  dataset_location: botany\n"
                                                            "  dataset_version: flowers-d2\n"))

    (spec,) = defs.specs(alongside=[])
    tree_defs = defs.tree().build_defs()

    assert (spec.dataset, spec.dataset_location, spec.dataset_version) == ("flowers", "botany", "flowers-d2")
    graph = tree_defs.resolve_asset_graph()
    shards = dg.AssetKey(["flowers", "shards"])
    assert not graph.get(shards).is_materializable  # built by the botany location, read from main
    assert shards in graph.get(dg.AssetKey(["iris_wide", "checkpoint"])).parent_keys


def test_the_platform_yaml_pipeline_still_reads_the_python_digits_shards():
    (spec,) = yaml_pipelines()
    graph = load_component_tree().build_defs().resolve_asset_graph()

    assert (spec.name, spec.dataset) == ("digits_cnn", "digits")
    assert dg.AssetKey(["digits", "shards"]) in graph.get(dg.AssetKey(["digits_cnn", "checkpoint"])).parent_keys


# --- errors name the file, the line and the field -------------------------------------------------


def test_a_bad_recipe_value_names_file_line_and_field(defs):
    defs.write("flowers", FLOWERS)
    path = defs.write("iris_mlp", training_block("iris_mlp", more="  recipe:\n    lr: 0.01\n    epochs: 0\n"))

    with pytest.raises(BlockDefinitionError) as raised:
        defs.specs()

    assert str(raised.value) == f"{path}:8: field 'recipe.epochs': must be at least 1 (pipeline 'iris_mlp')"
    assert isinstance(raised.value, PipelineDefinitionError)  # callers catching the core error still do


def test_an_unknown_model_points_at_model_name(defs):
    path = defs.write("iris_big", training_block("iris_big", "resnet9000"))

    with pytest.raises(BlockDefinitionError, match=re.escape(f"{path}:5: field 'model_name': unknown model "
                                                             "'resnet9000'")):
        defs.specs()


def test_a_field_left_to_its_default_points_at_attributes(defs):
    path = defs.write("flowers", FLOWERS.replace("  source: [flowers/*.csv]\n", ""))

    with pytest.raises(BlockDefinitionError, match=re.escape(f"{path}:2: field 'source': give file paths")):
        defs.specs()


@pytest.mark.parametrize("recipe, field, says", [
    ("{epochs: three}", "recipe.epochs", "Input should be a valid integer"),
    ("{epoch: 3}", "recipe.epoch", "not a field of recipe"),
])
def test_recipe_keys_are_checked_at_their_own_line(defs, recipe, field, says):
    path = defs.write("iris_mlp", training_block("iris_mlp", more=f"  recipe: {recipe}\n"))

    with pytest.raises(BlockDefinitionError, match=re.escape(f"{path}:6: field '{field}': {says}")):
        defs.specs()


def test_a_dataset_that_no_block_declares_is_named_at_the_dataset_line(defs):
    path = defs.write("iris_mlp", training_block("iris_mlp").replace("dataset: flowers", "dataset: roses"))
    says = f"{path}:4: field 'dataset': no dataset named 'roses' is declared here"

    with pytest.raises(BlockDefinitionError, match=re.escape(says)):
        defs.specs(alongside=[])
    # Dagster loading the folder wraps it in its own error, with ours as the cause
    with pytest.raises(ComponentTreeException) as raised:
        defs.tree().build_defs()
    assert isinstance(raised.value.__cause__, BlockDefinitionError)
    assert str(raised.value.__cause__).startswith(says)


def test_a_dataset_of_this_location_is_not_read_as_published_elsewhere(defs):
    defs.write("flowers", FLOWERS)
    path = defs.write("iris_mlp", training_block("iris_mlp", more="  dataset_location: botany\n"))
    says = f"{path}:6: field 'dataset_location': 'flowers' is declared in this code location"

    with pytest.raises(BlockDefinitionError, match=re.escape(says)):
        defs.specs()
    with pytest.raises(ComponentTreeException) as raised:
        defs.tree().build_defs()
    assert str(raised.value.__cause__).startswith(says)


def test_a_training_block_naming_another_training_block_is_told_the_owner(defs):
    defs.write("flowers", FLOWERS)
    defs.write("iris_mlp", training_block("iris_mlp"))
    path = defs.write("iris_copy", training_block("iris_copy").replace("dataset: flowers", "dataset: iris_mlp"))

    with pytest.raises(BlockDefinitionError, match=re.escape(f"{path}:4: field 'dataset': 'iris_mlp' itself trains "
                                                             "on shared data; name the owner 'flowers' instead")):
        defs.specs()


def test_two_blocks_of_one_name_are_both_named(defs):
    first = defs.write("flowers", FLOWERS)
    second = defs.write("flowers_again", FLOWERS)

    says = f"{second}:3: field 'name': is also declared at {first}:3"

    with pytest.raises(BlockDefinitionError, match=re.escape(says)):
        defs.specs()
    with pytest.raises(ComponentTreeException) as raised:
        defs.tree().build_defs()
    assert str(raised.value.__cause__).startswith(says)


def test_a_wrong_type_is_reported_by_dagster_at_its_line(defs):
    defs.write("flowers", FLOWERS.replace("  label: species\n", "  label: [species]\n"))

    with pytest.raises(ComponentTreeException) as raised:
        defs.specs()

    cause = raised.value.__cause__
    assert isinstance(cause, ValidationError)
    # Dagster's pydantic errors carry the attribute path and the file position
    assert f"attributes.label at {defs.folder / 'flowers' / 'defs.yaml'}:7" in str(cause)
    assert "Input should be a valid string" in str(cause)


def test_a_block_built_in_python_keeps_the_core_message():
    block = TrainingBlock(name="iris_mlp", dataset="flowers", model_name="mlp", recipe={"epochs": 0})

    with pytest.raises(PipelineDefinitionError, match=r"^pipeline 'iris_mlp', field 'recipe.epochs': must be"):
        block.to_spec()


# --- scaffolding ----------------------------------------------------------------------------------

# What a team fills in for each REQUIRED line of a template
FILLED = {
    "dataset": {"source": "[flowers/*.csv]", "features": "[petal_length, petal_width]", "label": "species",
                "classes": "[setosa, versicolor]"},
    "training": {"dataset": "flowers", "model_name": "mlp"},
    "pipeline": {"source": "[flowers/*.csv]", "features": "[petal_length, petal_width]", "label": "species",
                 "classes": "[setosa, versicolor]"},
}


def fill_required(path: Path, values: dict[str, str]) -> None:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if "# REQUIRED" in line:
            key = line.split(":")[0].strip()
            line = f"  {key}: {values[key]}"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("kind, block", [("dataset", DatasetBlock), ("training", TrainingBlock),
                                         ("pipeline", ModelPipelineComponent)])
def test_a_scaffolded_block_loads_once_its_required_fields_are_filled(defs, kind, block):
    if kind == "training":
        defs.write("flowers", FLOWERS)
    written = scaffold_block(kind, "new_block", defs.folder)

    assert written == defs.folder / "new_block" / "defs.yaml"
    with pytest.raises((PipelineDefinitionError, ComponentTreeException)):
        defs.specs()  # left as scaffolded, the REQUIRED lines do not load
    fill_required(written, FILLED[kind])
    (component,) = [c for c in defs.tree().get_all_components(of_type=block) if c.name == "new_block"]
    assert component.to_spec().name == "new_block"
    assert "new_block" in [s.name for s in defs.specs()]


@pytest.mark.parametrize("kind, block", [("dataset", DatasetBlock), ("training", TrainingBlock),
                                         ("pipeline", ModelPipelineComponent)])
def test_each_template_shows_every_field_of_its_block(kind, block):
    text = render(kind, "new_block")

    missing = [f for f in block.model_fields if not re.search(rf"^\s*(# )?{f}:", text, re.M)]
    assert missing == []
    assert f"type: pipelines.components.{block.__name__}" in text


def test_an_unfilled_template_fails_at_a_required_line(defs):
    written = scaffold_block("training", "new_block", defs.folder)
    required_line = next(i for i, line in enumerate(written.read_text().splitlines(), 1) if "# REQUIRED" in line)

    with pytest.raises(ComponentTreeException) as raised:
        defs.specs()

    assert f"{written}:{required_line}" in str(raised.value.__cause__)


def test_dagsters_scaffolding_writes_the_same_file_through_the_block_scaffolder(tmp_path):
    assert isinstance(get_scaffolder(DatasetBlock), BlockScaffolder)
    target = tmp_path / "flowers"

    scaffold_object(target, "pipelines.components.DatasetBlock", None, "yaml", None)  # what `dg scaffold` calls

    assert (target / "defs.yaml").read_text(encoding="utf-8") == render("dataset", "flowers")


@pytest.mark.parametrize("kind, name, error, says", [
    ("model", "flowers", ValueError, "unknown block kind 'model'"),
    ("dataset", "Flowers", ValueError, "'Flowers' is not a block name"),
    ("dataset", "../flowers", ValueError, "is not a block name"),
])
def test_scaffolding_refuses_a_bad_kind_or_name(defs, kind, name, error, says):
    with pytest.raises(error, match=re.escape(says)):
        scaffold_block(kind, name, defs.folder)
    assert sorted(p.name for p in defs.folder.iterdir()) == ["__init__.py"]


def test_scaffolding_refuses_an_existing_folder_and_a_missing_defs_dir(defs, tmp_path):
    scaffold_block("dataset", "flowers", defs.folder)
    before = (defs.folder / "flowers" / "defs.yaml").read_text()

    with pytest.raises(FileExistsError, match="already exists"):
        scaffold_block("training", "flowers", defs.folder)
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        scaffold_block("dataset", "roses", tmp_path / "no_such_defs")
    assert (defs.folder / "flowers" / "defs.yaml").read_text() == before
