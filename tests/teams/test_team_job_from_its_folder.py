"""A team's package outside the repository, run as docs/teams.md says: ``dagster job execute -m
<package>.definitions -a defs -j <job> -d <its folder>`` from some other folder. Without ``-d``
Dagster cannot import the package (``No module named 'cellar'``); with it the job runs and its
dataset version reaches main, which ``python -m pipelines log`` then shows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DAGSTER = str(Path(sys.executable).with_name("dagster"))
DEFINITIONS = textwrap.dedent('''
    from pipelines.api import (QualitySuite, dataset_pipeline, standard_raw_expectations, standard_shard_expectations,
                               team_definitions)
    from pipelines.models.wine import FEATURES, load_wine_frame

    cellar_wine = dataset_pipeline(
        "cellar_wine", source=load_wine_frame, features=FEATURES, label="cultivar", classes=range(3),
        id_column="sample_id", split={"seed": 1, "samples_per_shard": 64},
        expectations=QualitySuite(raw=lambda spec: standard_raw_expectations(spec, min_rows=150, value_range=(0, 2000)),
                                  shards=lambda spec: standard_shard_expectations(spec, max_fraction_error=0.08)))
    defs = team_definitions("cellar", [cellar_wine])
''')


def test_a_team_job_outside_the_repository_runs_with_its_folder_given_by_d(tmp_path):
    code = tmp_path / "cellar-pipelines"
    (code / "cellar").mkdir(parents=True)
    (code / "cellar" / "__init__.py").touch()
    (code / "cellar" / "definitions.py").write_text(DEFINITIONS)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    elsewhere = tmp_path / "elsewhere"  # where the user happens to be: neither the repository nor the package
    elsewhere.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLATFORM_PROFILE")},
           "DAGSTER_HOME": str(home)}
    command = [DAGSTER, "job", "execute", "-m", "cellar.definitions", "-a", "defs", "-j", "cellar_wine_training"]

    without = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert without.returncode != 0 and "No module named 'cellar'" in without.stderr + without.stdout

    with_d = subprocess.run([*command, "-d", str(code)], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=600)
    assert with_d.returncode == 0, (with_d.stdout + with_d.stderr)[-4000:]
    log = subprocess.run([sys.executable, "-m", "pipelines", "log", "--first-parent"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=120)
    assert log.returncode == 0, log.stderr
    assert "Publish dataset cellar_wine (cellar_wine-d1) (merge)" in log.stdout.splitlines()[3]
