"""Team code locations: a team's own package and location, checked across the workspace, and a
pipeline in one location training on a dataset another location publishes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from core.spec import PipelineDefinitionError
from pipelines.workspace import check_workspace, workspace_problems

REPO = Path(__file__).resolve().parents[2]

OWNER = '''
from pipelines.api import (QualitySuite, model_pipeline, standard_raw_expectations, standard_shard_expectations,
                           team_definitions)
from pipelines.models.wine import FEATURES, load_wine_frame

grapes = model_pipeline(
    "{dataset}", source=load_wine_frame, features=FEATURES, label="cultivar", classes=range(3),
    id_column="sample_id",
    expectations=QualitySuite(raw=lambda spec: standard_raw_expectations(spec, min_rows=150),
                              shards=lambda spec: standard_shard_expectations(spec, max_fraction_error=0.08)),
    model="mlp", model_kwargs={{"hidden_sizes": [16]}},
    recipe={{"epochs": 4, "batch_size": 16, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 100}},
    gate={{"min_test_accuracy": 0.5}}, split={{"seed": 1, "samples_per_shard": 64}}, team="cellar")

defs = team_definitions("{location}", [grapes])
'''

CONSUMER = '''
from pipelines.api import model_pipeline, team_definitions

blend = model_pipeline(
    "{name}", dataset="{dataset}", dataset_location="{owner}", model="mlp", model_kwargs={{"hidden_sizes": [8]}},
    recipe={{"epochs": 4, "batch_size": 16, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 100}},
    gate={{"min_test_accuracy": 0.5}}, triggers={{"on_new_data": True}}, team="tasting")

defs = team_definitions("{location}", [blend])
'''


def write_package(root: Path, package: str, source: str) -> None:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "definitions.py").write_text(textwrap.dedent(source))


def write_workspace(root: Path, locations: dict[str, str], with_platform: bool = False,
                    name: str = "workspace.yaml") -> Path:
    entries = [("platform", "pipelines.definitions", REPO)] if with_platform else []
    entries += [(name, f"{package}.definitions", root) for name, package in locations.items()]
    text = "load_from:\n" + "".join(
        f"  - python_module:\n      module_name: {module}\n      attribute: defs\n"
        f"      location_name: {name}\n      working_directory: {wd}\n" for name, module, wd in entries)
    path = root / name
    path.write_text(text)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    return tmp_path


def test_workspace_problems_name_both_locations_and_the_fix():
    listings = {
        "platform": [{"name": "digits", "dataset": None, "dataset_location": None}],
        "vision": [{"name": "digits", "dataset": None, "dataset_location": None},
                   {"name": "wide", "dataset": "digits", "dataset_location": "nlp"}],
    }
    problems = workspace_problems(listings)
    assert problems == [
        "pipeline 'digits' is defined in code locations 'platform' and 'vision'; rename one (pipeline names are "
        "asset key prefixes)",
        "dataset 'digits' is published by code locations 'platform' and 'vision'; rename one",
        "pipeline 'wide' in code location 'vision' reads dataset 'digits' from code location 'nlp', but it is "
        "published by 'platform'; fix its dataset_location",
    ]
    assert workspace_problems({"a": [{"name": "x", "dataset": None, "dataset_location": None}],
                               "b": [{"name": "y", "dataset": "x", "dataset_location": "a"}]}) == []


def test_two_team_locations_beside_the_platform_load_and_check(home):
    write_package(home, "cellar_pkg", OWNER.format(dataset="grapes", location="cellar"))
    write_package(home, "tasting_pkg", CONSUMER.format(name="blend", dataset="grapes", owner="cellar",
                                                       location="tasting"))
    workspace = write_workspace(home, {"cellar": "cellar_pkg", "tasting": "tasting_pkg"}, with_platform=True)

    listings = check_workspace(workspace)

    assert sorted(listings) == ["cellar", "platform", "tasting"]
    assert [p["name"] for p in listings["tasting"]] == ["blend"]

    # Dagster itself loads the two team locations (a code server each); the consumer's checkpoint
    # hangs off the owner's shards, which only the owner's location materializes.
    teams_only = write_workspace(home, {"cellar": "cellar_pkg", "tasting": "tasting_pkg"}, name="teams.yaml")
    (home / "instance").mkdir()
    with dg.DagsterInstance.local_temp(str(home / "instance")) as instance, WorkspaceProcessContext(
            instance, WorkspaceFileTarget(paths=[str(teams_only)])) as process:
        request = process.create_request_context()
        errors = {name: entry.load_error for name, entry in request.get_code_location_entries().items()
                  if entry.load_error}
        assert errors == {}
        graph = request.asset_graph
        shards, checkpoint = dg.AssetKey(["grapes", "shards"]), dg.AssetKey(["blend", "checkpoint"])
        assert shards in graph.get(checkpoint).parent_keys
        assert graph.get(shards).is_materializable
        assert graph.get_repository_handle(shards).location_name == "cellar"
        assert graph.get_repository_handle(checkpoint).location_name == "tasting"
        assert "grapes_training" in graph.get_materialization_job_names(shards)


def test_a_clash_between_locations_is_refused_naming_both(home):
    write_package(home, "clash_pkg", OWNER.format(dataset="digits", location="vision"))
    workspace = write_workspace(home, {"vision": "clash_pkg"}, with_platform=True)

    with pytest.raises(PipelineDefinitionError) as err:
        check_workspace(workspace)

    assert "pipeline 'digits' is defined in code locations 'platform' and 'vision'" in str(err.value)
    assert "dataset 'digits' is published by code locations 'platform' and 'vision'" in str(err.value)


def test_a_location_name_that_differs_from_the_definitions_is_refused(home):
    write_package(home, "misnamed_pkg", OWNER.format(dataset="merlot", location="cellar"))
    workspace = write_workspace(home, {"winery": "misnamed_pkg"})

    with pytest.raises(PipelineDefinitionError, match="'winery' .* was built as 'cellar'"):
        check_workspace(workspace)


def test_the_repository_workspace_is_consistent():
    listings = check_workspace(REPO / "workspace.yaml")
    assert "platform" in listings
