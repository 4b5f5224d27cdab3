"""Every definition loads, the way the webserver and daemon load them."""

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from pipelines.definitions import build_definitions
from pipelines.models import PIPELINES
from pipelines.profiles import Profile

REPO = Path(__file__).resolve().parents[1]


def test_definitions_module_loads_all_assets_and_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    defs = build_definitions(Profile.from_environment(), PIPELINES)
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    for spec in PIPELINES:
        assert {f"{spec.name}/{s}" for s in ("raw_dataset", "shards", "checkpoint", "model_version")} <= keys
        defs.resolve_job_def(f"{spec.name}_training")


def test_workspace_loads_with_dagster_cli(tmp_path):
    env = {"DAGSTER_HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent)}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    out = subprocess.run([sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr


def test_duplicate_pipeline_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="defined twice"):
        build_definitions(Profile(name="local", data_root=tmp_path), [PIPELINES[0], PIPELINES[0]])


def test_unknown_profile_is_refused(monkeypatch):
    monkeypatch.setenv("PLATFORM_PROFILE", "cloud")
    with pytest.raises(ValueError, match="not a profile"):
        Profile.from_environment()
