"""``python -m pipelines train MODEL`` after the sources changed, as a user meets it (issue 45).

A team's location outside the repository declares an image dataset read from a local folder
(``$DAGSTER_HOME/platform/sources/digits_png``, one sub-folder per class, as docs/images-and-text.md
shows) and a small model trained on it. Every command is ``python -m pipelines ...`` in a fresh
process, run from the folder that holds the team's ``workspace.yaml``:

1. ``train`` makes digits_png-d1;
2. new PNGs land in the folder; ``train`` made nothing new and trained on d1 without a word: now it
   makes digits_png-d2 first and trains on it;
3. ``sources add NEW/`` would hide the folder behind the store's area (the run then read only the
   new files): refused, naming the command that moves the folder over; a class folder given alone
   is refused; ``workspace`` reads the same ``./workspace.yaml``;
4. the folder moved over unchanged, ``train`` reads the store's area, says so, and reuses d2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.registry import read_lineage

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

DEFINITIONS = '''\
from pipelines.api import ImageFolder, ImagePreprocessing, dataset_pipeline, model_pipeline, team_definitions

digits_png = dataset_pipeline("digits_png", source=ImageFolder(root="digits_png"), classes=("0", "1"),
                              preprocessing=ImagePreprocessing(size=(8, 8), channels="L"),
                              split={"seed": 0, "samples_per_shard": 64})
digits_png_mlp = model_pipeline("digits_png_mlp", dataset="digits_png", model="mlp", model_kwargs={"hidden_sizes": [8]},
                                recipe={"epochs": 1, "batch_size": 8, "world_size": 1})
defs = team_definitions("pngteam", [digits_png, digits_png_mlp])
'''


def write_pngs(folder: Path, start: int, per_class: int) -> None:
    """Grey 12x12 PNGs, class 1 brighter than class 0."""
    rng = np.random.default_rng(start)
    for label in ("0", "1"):
        (folder / label).mkdir(parents=True, exist_ok=True)
        for i in range(start, start + per_class):
            pixels = rng.integers(0, 100, (12, 12)) + (120 if label == "1" else 0)
            Image.fromarray(pixels.astype(np.uint8), "L").save(folder / label / f"{label}-{i:04d}.png")


@pytest.fixture
def user(tmp_path):
    team = tmp_path / "team"
    (team / "pngteam").mkdir(parents=True)
    (team / "pngteam" / "__init__.py").write_text("")
    (team / "pngteam" / "definitions.py").write_text(DEFINITIONS)
    (tmp_path / "workspace.yaml").write_text(
        "load_from:\n  - python_module:\n      module_name: pngteam.definitions\n      attribute: defs\n"
        f"      location_name: pngteam\n      working_directory: {team}\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE")}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)

    return tmp_path, home, cli


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout + result.stderr


def test_train_after_the_sources_changed_makes_the_new_version_and_sources_stay_in_one_place(user):
    root, home, cli = user
    folder = home / "platform" / "sources" / "digits_png"
    write_pngs(folder, 0, 12)
    out = ok(cli("train", "digits_png_mlp"))
    assert "digits_png_mlp trained on digits_png-d1, made by this run" in out
    assert f"digits_png: reading 24 file(s) from the local sources folder {home / 'platform' / 'sources'}" in out

    write_pngs(folder, 100, 3)  # 6 new images in the folder the dataset reads
    out = ok(cli("train", "digits_png_mlp"))
    assert "digits_png: the sources and code differ from digits_png-d1's" not in out  # only the sources changed
    assert "digits_png: the sources differ from digits_png-d1's; ingesting and sharding a new version" in out
    assert "digits_png_mlp trained on digits_png-d2, made by this run from the sources of 'digits_png'" in out
    store_root = home / "platform" / "store"
    from resources.platform import VersionedStoreResource

    store = VersionedStoreResource(kind="local", local_root=str(store_root)).get()
    assert read_lineage(store, "digits_png_mlp", 2)["data"]["dataset_version"] == "digits_png-d2"

    new = root / "NEW5"
    write_pngs(new, 200, 2)
    refused = cli("sources", "add", "digits_png", "NEW5/")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    move = f"python -m pipelines sources add digits_png {folder} NEW5/"
    assert ("pipeline 'digits_png' reads its 30 source file(s) from the local sources folder" in refused.stderr
            and f"Move the folder over with them in one commit: `{move}`" in refused.stderr), refused.stderr
    flattened = cli("sources", "add", "digits_png", "NEW5/1")
    assert flattened.returncode == 2 and "NEW5/1 is named like class '1': add the folder that holds it" in \
        flattened.stderr, flattened.stderr
    assert "pngteam: digits_png, digits_png_mlp (reads digits_png)" in ok(cli("workspace"))  # ./workspace.yaml

    ok(cli("sources", "add", "digits_png", str(folder)))  # the folder alone, as it is
    out = ok(cli("train", "digits_png_mlp"))
    assert "digits_png: reading 30 file(s) from the store's sources/ area at commit" in out
    assert "digits_png: reusing digits_png-d2" in out  # the same files, read from their one place now
    assert "digits_png_mlp trained on digits_png-d2, reused: the sources of 'digits_png' are unchanged." in out


# --- a model on another location's dataset: told when that location's sources are newer --------------
LIBRARY = '''\
from pipelines.api import TextCorpus, TextPreprocessing, dataset_pipeline, team_definitions

books = dataset_pipeline("books", source=TextCorpus(paths=("books/*.txt",)), task="language_modeling",
                         split={"samples_per_shard": 8}, preprocessing=TextPreprocessing(seq_len=16))
defs = team_definitions("library", [books])
'''


def test_a_pinned_or_newest_version_of_another_locations_dataset_says_when_newer_sources_exist(tmp_path, monkeypatch):
    import argparse
    import dataclasses

    import dagster as dg

    from core.spec import model_pipeline
    from pipelines.assembly import location_definitions
    from pipelines.cli.experiments import dataset_notes
    from pipelines.cli.lookup import find_pipeline
    from pipelines.profiles import Profile

    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "library_defs.py").write_text(LIBRARY)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - python_module:\n      module_name: library_defs\n      attribute: defs\n"
                         f"      location_name: library\n      working_directory: {tmp_path / 'library'}\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.syspath_prepend(str(tmp_path / "library"))
    profile = Profile.from_environment()
    books_dir = profile.data_root / "sources" / "books"
    books_dir.mkdir(parents=True)
    for i in range(40):
        (books_dir / f"b{i:02d}.txt").write_text(f"book {i} " + "words of a book " * (5 + i))
    owner = find_pipeline("books", workspace, "library").spec
    with dg.DagsterInstance.ephemeral() as instance:
        job = location_definitions("library", [owner], profile).resolve_job_def("books_training")
        assert job.execute_in_process(instance=instance, raise_on_error=False).success  # publishes books-d1
    pinned = model_pipeline("books_lm", dataset="books", dataset_location="library", dataset_version="books-d1",
                            task="language_modeling", model="transformer_lm")
    newest = dataclasses.replace(pinned, dataset_version=None)
    args = argparse.Namespace(workspace=workspace, location=None)

    assert dataset_notes(pinned, args, profile) == [
        "books_lm trains on books-d1, as its pipeline pins: dataset 'books' (location 'library') is unchanged since"]
    assert dataset_notes(newest, args, profile) == [
        "books_lm trains on books-d1, the newest version of dataset 'books' (location 'library'): its sources are "
        "unchanged since"]

    (books_dir / "b99.txt").write_text("a new book " * 20)
    assert dataset_notes(pinned, args, profile) == [
        "note: books_lm is pinned to books-d1 (dataset_version) and newer sources exist: dataset 'books' (location "
        "'library')'s sources differ from books-d1's. It trains on books-d1 as pinned; leave dataset_version out to "
        "train on the newest version"]
    assert dataset_notes(newest, args, profile) == [
        "note: dataset 'books' (location 'library')'s sources differ from its newest version books-d1's; books_lm "
        "trains on books-d1: that location makes the new version (its job books_training), then train again"]


def test_train_on_a_dataset_pipeline_names_the_pipelines_that_train_on_it(capsys):
    from pipelines.cli import main

    assert main(["train", "diabetes", "--workspace", str(REPO / "workspace.yaml")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: pipeline 'diabetes' (code location 'platform') prepares a dataset and trains no model; the "
        "pipeline(s) that train on it: diabetes_mlp (e.g. `python -m pipelines train diabetes_mlp`)")
