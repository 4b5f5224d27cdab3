import copy

import pytest

from training_runtime.config import ConfigError, RunConfig
from training_runtime.train.faults import FaultInjection
from tests.runtime.helpers import make_config, make_dataset


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfg")
    manifest, locations = make_dataset(root, n_train=40, n_test=8, per_shard=16)
    return make_config(root, manifest, locations)


def _err(d) -> str:
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(d)
    return str(e.value)


def test_round_trip_keeps_every_field(base):
    cfg = RunConfig.from_dict(base)
    again = RunConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert cfg.train.batch_size == 16 and cfg.checkpoint.every_steps == 4
    assert cfg.data.s3_endpoint_url is None


def test_defaults_fill_optional_sections(base):
    d = copy.deepcopy(base)
    del d["telemetry"]
    d["train"] = {}
    cfg = RunConfig.from_dict(d)
    assert cfg.train.epochs == 5 and cfg.train.optimizer == "adamw" and cfg.telemetry.every_steps == 10


def test_every_field_has_a_description():
    import dataclasses

    from training_runtime import config

    for cls in (config.RunConfig, config.ModelConfig, config.DataConfig, config.TrainConfig,
                config.CheckpointConfig, config.TelemetryConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("description"), f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("path, value, expected", [
    (("train", "lr_rate"), 0.1, "unknown key 'train.lr_rate'"),
    (("extra",), 1, "unknown key 'extra'"),
    (("train", "epochs"), "five", "train.epochs must be int"),
    (("train", "epochs"), True, "train.epochs must be int"),
    (("train", "epochs"), 0, "train.epochs must be >= 1"),
    (("train", "optimizer"), "adam", "train.optimizer must be one of"),
    (("train", "sharding"), "zero3", "train.sharding must be one of"),
    (("train", "precision"), "fp16", "train.precision must be one of"),
    (("train", "lr"), -1, "train.lr must be a positive"),
    (("train", "warmup_steps"), 5, "train.warmup_steps is not used by train.lr_schedule 'cosine'"),
    (("checkpoint", "dir"), "relative/ckpt", "checkpoint.dir must be an absolute path"),
    (("checkpoint", "keep_last"), 0, "checkpoint.keep_last must be >= 1"),
    (("output_dir",), "out", "output_dir must be an absolute path"),
    (("model", "name"), "resnet9000", "model.name 'resnet9000' is unknown"),
    (("model", "name"), "no_such_pkg.mod:make", "cannot import module 'no_such_pkg.mod'"),
    (("model", "name"), "tests.runtime.user_model:missing", "has no callable 'missing'"),
    (("data", "s3_endpoint_url"), 5, "data.s3_endpoint_url must be str"),
    (("model", "kwargs"), {"width": 3}, "model 'mlp' cannot be built with model.kwargs {'width': 3}"),

])
def test_invalid_values_name_the_field(base, path, value, expected):
    d = copy.deepcopy(base)
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert expected in _err(d)


def test_missing_required_key(base):
    d = copy.deepcopy(base)
    del d["checkpoint"]["dir"]
    assert "missing required key 'checkpoint.dir'" in _err(d)


def test_manifest_inconsistencies_are_caught(base):
    d = copy.deepcopy(base)
    d["data"]["manifest"]["splits"]["train"]["shards"][0]["num_bytes"] += 1
    assert "data.manifest.splits.train.shards[0].num_bytes" in _err(d)
    d = copy.deepcopy(base)
    d["data"]["manifest"]["format"] = "other/v2"
    assert "data.manifest.format" in _err(d)
    d = copy.deepcopy(base)
    d["data"]["manifest"]["splits"]["train"]["num_samples"] = 41
    assert "data.manifest.splits.train.num_samples" in _err(d)


def test_locations_must_cover_train_shards(base):
    d = copy.deepcopy(base)
    d["data"]["locations"].pop("shards/train/00001.bin")
    assert "data.locations has no location for shard 'shards/train/00001.bin'" in _err(d)
    d = copy.deepcopy(base)
    d["data"]["locations"]["shards/train/00001.bin"] = "http://host/x"
    assert "must be 'file:///abs/path' or 's3://bucket/key'" in _err(d)


def test_impossible_world_sizes(base):
    cfg = RunConfig.from_dict(base)  # 40 training samples, batch 16
    cfg.validate_world_size(2)
    with pytest.raises(ConfigError, match=r"train.batch_size=16 is not divisible by world_size \(3\)"):
        cfg.validate_world_size(3)
    cfg.train.grad_accum_steps = 16
    with pytest.raises(ConfigError, match="train.grad_accum_steps"):
        cfg.validate_world_size(2)
    cfg.train.grad_accum_steps, cfg.train.batch_size = 1, 64
    with pytest.raises(ConfigError, match="world_size 64 exceeds the 40 training samples"):
        cfg.validate_world_size(64)


def test_model_is_checked_against_the_feature_shape(base):
    d = copy.deepcopy(base)
    d["model"] = {"name": "cnn", "kwargs": {}}
    d["data"]["manifest"]["feature_shape"] = [10]
    for shard in d["data"]["manifest"]["splits"]["train"]["shards"]:
        shard["num_bytes"] = shard["num_samples"] * (10 * 4 + 8)
    for split in ("validation", "test"):
        d["data"]["manifest"]["splits"].pop(split)
    assert "model 'cnn' cannot be built" in _err(d) and "needs feature_shape" in _err(d)
    d = copy.deepcopy(base)
    d["model"] = {"name": "tests.runtime.user_model:tiny_linear", "kwargs": {"depth": 2}}
    assert "cannot be built with model.kwargs {'depth': 2}" in _err(d)
    d["model"]["kwargs"] = {"bias": False}
    RunConfig.from_dict(d)


@pytest.mark.parametrize("spec, expected", [
    ("1:7", FaultInjection(rank=1, step=7)),
    ("0:12:checkpoint", FaultInjection(rank=0, step=12, in_checkpoint_write=True)),
])
def test_fault_hook_specs(monkeypatch, spec, expected):
    from training_runtime.train.faults import FAULT_ENV, fault_from_env

    monkeypatch.setenv(FAULT_ENV, spec)
    assert fault_from_env() == expected
    assert expected.kill_mid_step(expected.rank, expected.step, 0) is not expected.in_checkpoint_write
    assert expected.kill_in_checkpoint_write(expected.rank, expected.step, 0) is expected.in_checkpoint_write
    assert not expected.kill_mid_step(expected.rank, expected.step, 1)  # never on a restarted attempt
    assert not expected.kill_in_checkpoint_write(expected.rank, expected.step, 1)


@pytest.mark.parametrize("spec", ["1", "a:2", "1:2:optimizer", "1:2:checkpoint:x"])
def test_malformed_fault_hook_specs_say_the_format(monkeypatch, spec):
    from training_runtime.train.faults import FAULT_ENV, fault_from_env

    monkeypatch.setenv(FAULT_ENV, spec)
    with pytest.raises(ConfigError, match="RANK:STEP"):
        fault_from_env()
