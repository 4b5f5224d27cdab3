"""Team code anywhere its code location can import it: the location's import roots reach the local
training workers' PYTHONPATH through the launcher resource, with nothing exported by hand; and a
location's pipelines that name no team are tagged with the location."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from pipelines.api import location_code_paths, location_team, model_pipeline, team_definitions
from pipelines.automation import TEAM_TAG
from pipelines.models.wine import FEATURES, load_wine_frame
from pipelines.profiles import Profile
from resources.launch.base import TrainingJob
from resources.launch.local import PLATFORM_ROOT, LocalTorchrunLauncher, worker_env

REPO = Path(__file__).resolve().parents[2]


def write_module(root: Path, dotted: str, text: str = "") -> Path:
    *packages, name = dotted.split(".")
    folder = root.joinpath(*packages)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(len(packages)):
        (root.joinpath(*packages[:i + 1]) / "__init__.py").touch()
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def test_the_roots_are_the_defining_modules_and_those_its_pipelines_import(tmp_path, monkeypatch):
    defs_file = write_module(tmp_path / "location", "vineyard.team.definitions")
    write_module(tmp_path / "elsewhere", "cellar_loops.fit", "def fit(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    monkeypatch.syspath_prepend(str(tmp_path / "location"))
    spec = model_pipeline("blend", source=load_wine_frame, features=FEATURES, label="cultivar", classes=range(3),
                          id_column="sample_id", model="mlp", train="cellar_loops.fit:fit", task="classification")
    roots = location_code_paths([spec], {"__name__": "vineyard.team.definitions", "__file__": str(defs_file)})
    assert roots == (str(tmp_path / "location"), str(tmp_path / "elsewhere"))
    # A package's __init__, and a python_file loaded under a name of its own.
    assert location_code_paths([], {"__name__": "vineyard", "__file__": str(tmp_path / "location/vineyard/__init__.py")}) \
        == (str(tmp_path / "location"),)
    assert location_code_paths([], {"__name__": "defs_1234", "__file__": str(tmp_path / "defs.py")}) == (str(tmp_path),)
    # Installed packages (torch's folder is site-packages) and a script run as __main__ add nothing.
    installed = Path(sysconfig.get_paths()["purelib"])
    assert location_code_paths([], {"__name__": "torch", "__file__": str(installed / "torch" / "__init__.py")}) == ()
    assert location_code_paths([], {"__name__": "__main__", "__file__": str(tmp_path / "run.py")}) == ()


def test_the_roots_travel_to_the_launcher_and_come_first_on_the_workers_path(tmp_path):
    profile = Profile(name="local", data_root=tmp_path, code_paths=("/teams/cellar", "/teams/shared"))
    launcher = profile.resources()["launcher"].get()
    assert isinstance(launcher, LocalTorchrunLauncher) and launcher.python_path == ("/teams/cellar", "/teams/shared")
    job = TrainingJob(name="j", config={"checkpoint": {"dir": str(tmp_path / "c")}}, nproc_per_node=2)
    env = worker_env(job, [], environ={"PYTHONPATH": f"/mine{os.pathsep}/teams/cellar"}, cpu_count=4,
                     python_path=launcher.python_path)
    assert env["PYTHONPATH"].split(os.pathsep) == ["/teams/cellar", "/teams/shared", str(PLATFORM_ROOT), "/mine"]
    assert worker_env(job, [], environ={}, cpu_count=4)["PYTHONPATH"] == str(PLATFORM_ROOT)


def test_a_worker_imports_team_code_outside_the_repository_only_through_the_location(tmp_path, monkeypatch):
    """The failure issue 27 saw (``No module named '<team package>'`` in every local worker), and its fix."""
    write_module(tmp_path / "team-code", "cellar_team.loops", "def fit(ctx):\n    pass\n")
    defs_file = write_module(tmp_path / "team-code", "cellar_team.definitions", textwrap.dedent('''
        from pipelines.api import model_pipeline, team_definitions
        from pipelines.models.wine import FEATURES, load_wine_frame

        blend = model_pipeline("blend", source=load_wine_frame, features=FEATURES, label="cultivar",
                               classes=range(3), id_column="sample_id", model="mlp", train="cellar_team.loops:fit")
        defs = team_definitions("cellar", [blend])
    '''))
    monkeypatch.syspath_prepend(str(tmp_path / "team-code"))  # as Dagster imports the location
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    namespace = {"__name__": "cellar_team.definitions", "__file__": str(defs_file)}
    exec(compile(defs_file.read_text(), str(defs_file), "exec"), namespace)
    launcher = namespace["defs"].resources["launcher"].get()
    job = TrainingJob(name="j", config={"checkpoint": {"dir": str(tmp_path / "c")}}, nproc_per_node=1)
    probe = [sys.executable, "-c", "from cellar_team.loops import fit; print('imported', fit.__module__)"]
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with_location = {**clean, **worker_env(job, [], environ=clean, python_path=launcher.python_path)}
    done = subprocess.run(probe, cwd=tmp_path, env=with_location, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "imported cellar_team.loops", done.stderr
    without = {**clean, **worker_env(job, [], environ=clean)}
    failed = subprocess.run(probe, cwd=tmp_path, env=without, capture_output=True, text=True)
    assert failed.returncode != 0 and "No module named 'cellar_team'" in failed.stderr


def test_pipelines_that_name_no_team_are_the_locations(tmp_path):
    profile = Profile(name="local", data_root=tmp_path)
    common = dict(source=load_wine_frame, features=FEATURES, label="cultivar", classes=range(3),
                  id_column="sample_id", model="mlp")
    unnamed = model_pipeline("house_red", **common)
    named = model_pipeline("reserve", team="sommeliers", **common)
    defs = team_definitions("Cellar-East", [unnamed, named], profile=profile)
    assert location_team("Cellar-East") == "cellar_east"
    tags = {job.name: job.tags for job in defs.get_repository_def().get_all_jobs() if job.name.endswith("_training")}
    assert tags["house_red_training"][TEAM_TAG] == "cellar_east"
    assert tags["reserve_training"][TEAM_TAG] == "sommeliers"
