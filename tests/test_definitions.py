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
        data = () if spec.dataset else ("raw_dataset", "shards")  # a model on a dataset reads its shards
        stages = data + (("checkpoint", "model_version") if spec.trains else ())
        assert {f"{spec.name}/{s}" for s in stages} <= keys
        if spec.dataset:
            assert {f"{spec.name}/raw_dataset", f"{spec.name}/shards"}.isdisjoint(keys)
        else:
            defs.resolve_job_def(f"{spec.name}_training")
    # datasets alone have no model of their own; the models trained on them do
    assert {"shapes/checkpoint", "pydoc/checkpoint", "diabetes/checkpoint"}.isdisjoint(keys)
    assert {"shapes_resnet/model_version", "pydoc_lm/model_version", "diabetes_mlp/model_version"} <= keys


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


def test_kubernetes_profile_loads_with_the_charts_settings(monkeypatch, tmp_path):
    """One switch: the same definitions with lakeFS, S3, GPU pods and the k8s step executor."""
    settings = {
        "PLATFORM_PROFILE": "kubernetes", "TRAINING_NAMESPACE": "model-factory", "TRAINING_IMAGE": "reg/training:1",
        "MODEL_FACTORY_SHARED_CLAIM": "model-factory-shared", "MODEL_FACTORY_SHARED_MOUNT": str(tmp_path),
        "DAGSTER_UI_URL": "https://dagster.example.com", "LAKEFS_REPOSITORY": "models",
        "LAKEFS_ENDPOINT": "http://lakefs:8000", "LAKEFS_ACCESS_KEY_ID": "AKIA", "LAKEFS_SECRET_ACCESS_KEY": "s",
        "ARTIFACT_BUCKET": "artifacts",
    }
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    profile = Profile.from_environment()
    assert profile.name == "kubernetes" and profile.data_root == tmp_path
    defs = build_definitions(profile, PIPELINES)
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_job_def(f"{PIPELINES[0].name}_training").executor_def.name == "k8s"
    resources = profile.resources()
    assert resources["store"].kind == "lakefs" and resources["artifacts"].kind == "s3"
    assert resources["launcher"].kind == "kubernetes"


def test_loading_definitions_imports_neither_torch_nor_great_expectations(tmp_path):
    # Every Dagster process (webserver, daemon, code server, run worker) loads them; torch alone
    # takes seconds to import. Model names are checked against training_runtime.models.names.
    probe = ("import sys, pipelines.definitions as d; d.defs.resolve_asset_graph(); "
             "print(sorted(m for m in ('torch', 'great_expectations', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                         env={"DAGSTER_HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
