"""FSDP settings that cannot apply are refused before any worker trains, in the words of the
layer the user set them in: the runtime's config (train.*), a pipeline's recipe (recipe.*) and a
run's --set override; a unit class the model lacks fails once, naming the classes it has."""

from __future__ import annotations

import re

import pytest

from core.overrides import OverrideError, apply_overrides, parse_set
from core.spec import PipelineDefinitionError, model_pipeline
from tests.runtime.helpers import make_config, make_dataset, torchrun
from training_runtime.config import ConfigError, RunConfig, fsdp_problems
from training_runtime.distributed.units import check_unit_names
from training_runtime.observe.attempts import attempts_root, read_attempts

TEAM_NET = "tests.distributed.user_blocks:team_net"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-settings")
    manifest, locations = make_dataset(root, n_train=64, n_test=16, per_shard=32)
    return root, manifest, locations


def _refused(cfg: dict) -> str:
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(cfg)
    return str(e.value)


@pytest.mark.parametrize("setting, value", [("activation_checkpointing", True), ("fsdp_units", "TeamBlock"),
                                            ("fsdp_unit_params", 4096)])
def test_fsdp_settings_under_ddp_are_refused_naming_the_setting_and_the_fix(data, setting, value):
    cfg = make_config(*data, model=TEAM_NET, model_kwargs={}, sharding="ddp", **{setting: value})
    message = _refused(cfg)
    assert message.startswith(f"train.{setting} is {value!r}, but train.sharding is 'ddp'")
    assert "set train.sharding to 'fsdp'" in message and f"or remove train.{setting}" in message
    cfg["train"]["sharding"] = "fsdp"  # the fix the message names
    assert RunConfig.from_dict(cfg).train.sharding == "fsdp"


@pytest.mark.parametrize("units, says", [("", "must be module class names"), (" , ", "must be module class names"),
                                         ("Team Block", "['Team Block'] are not class names"),
                                         ("TeamBlock,3x", "['3x'] are not class names")])
def test_unit_names_that_cannot_name_a_class_are_refused(data, units, says):
    cfg = make_config(*data, model=TEAM_NET, model_kwargs={}, sharding="fsdp", fsdp_units=units)
    assert says in _refused(cfg)


def test_valid_fsdp_settings_pass():
    assert fsdp_problems(sharding="fsdp", fsdp_units="TeamBlock, tests.distributed.user_blocks.TeamBlock",
                         fsdp_unit_params=None, activation_checkpointing=True) == []
    assert fsdp_problems(sharding="ddp", fsdp_units=None, fsdp_unit_params=None, activation_checkpointing=False) == []


def test_a_pipeline_and_a_runs_override_are_refused_when_definitions_load():
    table = dict(source="x.csv", features=["a", "b"], label="y", classes=["p", "q"])
    with pytest.raises(PipelineDefinitionError, match=re.escape(
            "recipe.activation_checkpointing': is True, but recipe.sharding is 'ddp'")):
        model_pipeline("m", **table, recipe={"activation_checkpointing": True})
    spec = model_pipeline("m", **table, recipe={"sharding": "fsdp", "fsdp_units": "TeamBlock"})
    with pytest.raises(OverrideError, match=re.escape("recipe.fsdp_units': is 'TeamBlock', but recipe.sharding is 'ddp'")):
        apply_overrides(spec, parse_set(["train.sharding=ddp"]))
    assert apply_overrides(spec, parse_set(["train.activation_checkpointing=true"])).recipe.activation_checkpointing


def test_unit_names_the_model_lacks_fail_on_the_meta_device_naming_its_classes(data):
    cfg = RunConfig.from_dict(make_config(*data, model=TEAM_NET, model_kwargs={}, sharding="fsdp",
                                          fsdp_units="TeamBlok"))
    build = cfg.model_build()
    with pytest.raises(ConfigError, match=r"names \['TeamBlok'\].*module classes are \[.*'TeamBlock'"):
        check_unit_names(build.build, ["TeamBlok"])
    check_unit_names(build.build, ["TeamBlock"])  # the right name passes


def test_a_unit_name_the_model_lacks_fails_the_launch_once_before_reading_data(data):
    """Through torchrun with a restart allowed: the config error ends the launch at once (no
    second attempt) and says why; it is raised by the context's check, before the shards are
    verified and the model built for real."""
    root, manifest, locations = data
    cfg = make_config(root, manifest, locations, name="bogus", model=TEAM_NET, model_kwargs={}, sharding="fsdp",
                      fsdp_units="bogus")
    proc = torchrun(cfg, root / "bogus.json", max_restarts=1)
    assert proc.returncode != 0
    (attempt,) = read_attempts(attempts_root(cfg["checkpoint"]["dir"]))  # a restart would leave a second record
    assert attempt.deterministic and attempt.failure["cause"] == "config"
    assert "train.fsdp_units names ['bogus']" in attempt.reason and "'TeamBlock'" in attempt.reason
    assert "check_unit_names" in proc.stderr  # the context's check on the meta device, not the real build's
    assert not (root / "bogus" / "out" / "model.safetensors").exists()


def test_the_train_command_refuses_activation_checkpointing_under_ddp_before_running(tmp_path):
    """What a user types: refused by the CLI itself (exit 2), nothing launched, the fix named."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env.update(DAGSTER_HOME=str(tmp_path), PYTHONPATH=str(repo))
    proc = subprocess.run([sys.executable, "-m", "pipelines", "train", "digits", "--set",
                           "train.activation_checkpointing=true"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "recipe.activation_checkpointing': is True, but recipe.sharding is 'ddp'" in proc.stderr
    assert "set recipe.sharding to 'fsdp'" in proc.stderr
    assert not (tmp_path / "platform" / "launches").exists()  # no training was launched
