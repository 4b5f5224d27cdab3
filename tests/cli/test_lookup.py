"""Every command that names a pipeline finds it in any code location of the workspace (workspace.yaml:
``python_module`` and ``python_file`` entries), ``--location`` picks one of two that define the name,
and an unknown name lists the locations searched and what they define."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.cli.errors import UsageError
from pipelines.cli.lookup import find_pipeline

_unique = itertools.count()
TEAM_LOOP = Path(__file__).resolve().parents[1] / "user_paths" / "team_package" / "train.py"

LOCATION = '''
from pipelines.api import model_pipeline, team_definitions
from pipelines.models.wine import FEATURES, load_wine_frame

{name} = model_pipeline(
    "{name}", source=load_wine_frame, features=FEATURES, label="cultivar", classes=range(3), id_column="sample_id",
    model="mlp", recipe={{"epochs": 1, "world_size": 1}}, train="{train}")

defs = team_definitions("{location}", [{name}])
'''


def write_location(root: Path, location: str, pipeline: str, *, as_file: bool = False) -> str:
    """A team location defining ``pipeline``; its workspace entry."""
    train = f"tf_{next(_unique)}.loops:fit"
    loops = root / train.split(".")[0]
    loops.mkdir()
    (loops / "__init__.py").write_text("")
    # The team's real training loop (the one tests/user_paths trains with), as each location's own copy.
    (loops / "loops.py").write_text(TEAM_LOOP.read_text())
    source = textwrap.dedent(LOCATION.format(name=pipeline, location=location, train=train))
    if as_file:
        (root / f"{location}_defs.py").write_text(source)
        return (f"  - python_file:\n      relative_path: {root / f'{location}_defs.py'}\n"
                f"      location_name: {location}\n      working_directory: {root}\n")
    package = f"loc_{location}_{next(_unique)}"
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    (root / package / "definitions.py").write_text(source)
    return (f"  - python_module:\n      module_name: {package}.definitions\n      location_name: {location}\n"
            f"      working_directory: {root}\n")


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """Locations "east" (a module) and "west" (a file), both defining "malbec"; "west" also "syrah"."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    root = tmp_path / "team-code"
    root.mkdir()
    text = "load_from:\n" + write_location(root, "east", "malbec") + write_location(root, "west", "malbec", as_file=True)
    (root / "extra").mkdir()
    text += write_location(root / "extra", "south", "syrah")
    path = tmp_path / "workspace.yaml"
    path.write_text(text)
    return path


def test_a_name_two_locations_define_needs_location_and_location_picks_one(workspace):
    with pytest.raises(UsageError) as err:
        find_pipeline("malbec", workspace)
    assert str(err.value) == (f"pipeline 'malbec' is defined in code locations 'east' and 'west' of {workspace}; "
                              "choose one with --location")
    west = find_pipeline("malbec", workspace, "west")
    assert west.location.name == "west" and west.spec.location == "west" and west.spec.team == "west"
    assert find_pipeline("syrah", workspace).location.name == "south"
    # The folders each location imports its own code from travel to its training workers.
    assert str(workspace.parent / "team-code" / "extra") in find_pipeline("syrah", workspace).code_paths


def test_an_unknown_name_lists_the_locations_searched_and_what_they_define(workspace):
    with pytest.raises(UsageError) as err:
        find_pipeline("merlot", workspace)
    assert str(err.value) == (f"no pipeline named 'merlot' in code location(s) east, west, south of {workspace} "
                              "(they define east: malbec; west: malbec; south: syrah)")
    with pytest.raises(UsageError, match=f"{workspace} has no code location 'north'; its locations are east, west, "
                                         "south"):
        find_pipeline("malbec", workspace, "north")
    with pytest.raises(UsageError, match="no pipeline named 'syrah' in code location\\(s\\) east of"):
        find_pipeline("syrah", workspace, "east")


# Each command that names a model, as a user types it; the model is unknown everywhere.
COMMANDS = [
    ["train", "merlot", "--set", "train.lr=0.1"], ["predict", "merlot", "rows.csv"], ["lineage", "merlot"],
    ["versions", "merlot"], ["compare", "merlot", "1", "2"], ["diff", "merlot", "1", "2"],
    ["promote", "merlot", "1"], ["rollback", "merlot"], ["comment", "merlot", "1", "a note"],
    ["sweeps", "merlot"], ["datasets", "merlot"], ["reproduce", "merlot", "1"], ["tensorboard", "merlot"],
    ["sources", "add", "merlot", "rows.csv"], ["export", "merlot", "out"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0] if a[0] != "sources" else "sources-add")
def test_every_command_that_names_a_pipeline_looks_in_every_location(workspace, argv, capsys):
    assert main([*argv, "--workspace", str(workspace)]) == 2
    # (A command that opens the instance first notes that it wrote the empty home's dagster.yaml.)
    err = "\n".join(line for line in capsys.readouterr().err.splitlines() if not line.startswith("note: "))
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "no " in err and "named 'merlot' in code location(s) east, west, south" in err, err


@pytest.mark.parametrize("argv", [["lineage", "syrah"], ["versions", "syrah"], ["tensorboard", "syrah"],
                                  ["predict", "syrah", "rows.csv"], ["reproduce", "syrah", "1"],
                                  ["export", "syrah", "out"]],
                         ids=lambda a: a[0])
def test_a_pipeline_found_in_a_location_without_versions_says_where_it_is(workspace, argv, capsys):
    assert main([*argv, "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("error: model 'syrah' (code location 'south') has no registered versions yet; train it "
                           "with `python -m pipelines train syrah` or run its job syrah_training")


def test_location_restricts_commands_that_read_the_store(workspace, capsys):
    assert main(["lineage", "syrah", "--location", "east", "--workspace", str(workspace)]) == 2
    assert "no pipeline named 'syrah' in code location(s) east of" in capsys.readouterr().err
    assert main(["train", "malbec", "--workspace", str(workspace)]) == 2
    assert "defined in code locations 'east' and 'west'" in capsys.readouterr().err


def test_the_default_workspace_is_the_current_directorys_then_the_repositorys(tmp_path, monkeypatch):
    from pipelines.cli.lookup import default_workspace
    from pipelines.profiles import REPO_ROOT

    monkeypatch.chdir(tmp_path)
    assert default_workspace() == REPO_ROOT / "workspace.yaml"
    (tmp_path / "workspace.yaml").write_text("load_from: []\n")
    assert default_workspace() == tmp_path / "workspace.yaml"


def test_a_models_own_code_is_imported_from_its_location_only_when_its_record_names_some(workspace, monkeypatch):
    import argparse
    import sys

    from pipelines.cli.lookup import model_code

    args = argparse.Namespace(location=None, workspace=workspace)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert model_code(args, "nowhere", {"model": {"name": "mlp"}, "task": "classification"}) == ()  # no lookup
    syrah = find_pipeline("syrah", workspace)
    paths = model_code(args, "syrah", {"model": {"name": "mlp"}, "train_fn": syrah.spec.train})
    assert paths == syrah.code_paths and all(p in sys.path for p in paths)


def test_sweeps_of_a_pipeline_without_one_says_it_declares_none(workspace, capsys):
    assert main(["sweeps", "syrah", "--workspace", str(workspace)]) == 0
    assert capsys.readouterr().out.strip() == ("model 'syrah' has no sweeps: its pipeline (code location 'south') "
                                               "declares none")


def test_a_location_that_does_not_load_hides_no_other_locations_pipelines(workspace, capsys):
    text = workspace.read_text() + ("  - python_module:\n      module_name: no_such_team.definitions\n"
                                    "      location_name: broken\n")
    workspace.write_text(text)
    assert find_pipeline("syrah", workspace).location.name == "south"
    assert "these code locations did not load and were not searched: broken (PipelineDefinitionError: code " \
           "location broken" in capsys.readouterr().err
    with pytest.raises(UsageError, match="no pipeline named 'merlot' .*; these did not load: broken "):
        find_pipeline("merlot", workspace)
    with pytest.raises(Exception, match="No module named 'no_such_team'"):
        find_pipeline("syrah", workspace, "broken")
