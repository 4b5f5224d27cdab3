"""The trainer in-process as a world of one rank, and the entry point's early failures."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from training_runtime.__main__ import main
from training_runtime.config import ConfigError, RunConfig
from training_runtime.data.shards import DataError
from training_runtime.train.step import lr_multiplier
from training_runtime.train.trainer import Trainer
from tests.runtime.helpers import make_config, make_dataset


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("inproc")
    manifest, locations = make_dataset(root, n_train=64, n_test=16, feature_shape=(16,), per_shard=20)
    return root, manifest, locations


def _run(problem, info, name, **train):
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name=name, **train)
    d.pop("_model", None)
    cfg = RunConfig.from_dict(d)
    metrics = Trainer(cfg, info).run()
    return cfg, metrics, load_file(f"{cfg.output_dir}/model.safetensors")


def test_grad_accumulation_matches_one_big_batch(problem, world_of_one):
    _, m1, w1 = _run(problem, world_of_one, "accum1", optimizer="sgd", max_steps=6)
    _, m2, w2 = _run(problem, world_of_one, "accum4", optimizer="sgd", max_steps=6,
                     grad_accum_steps=4)
    assert m1["steps"] == m2["steps"] == 6
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model, kwargs, precision, sharding", [
    ("cnn", {"channels": 4}, "fp32", "ddp"),
    ("transformer", {"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32}, "fp32", "ddp"),
    ("transformer", {"d_model": 16, "nhead": 2, "num_layers": 1, "dim_feedforward": 32}, "fp32", "fsdp"),
    ("cnn", {"channels": 4}, "fp32", "fsdp"),
    ("mlp", {"hidden_sizes": [16], "dropout": 0.1}, "bf16", "ddp"),
])
def test_models_and_precisions_train(problem, world_of_one, model, kwargs, precision, sharding):
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name=f"m_{model}_{precision}_{sharding}", model=model,
                    model_kwargs=kwargs, precision=precision, max_steps=5, sharding=sharding,
                    lr_schedule="linear_warmup_cosine", warmup_steps=2)
    cfg = RunConfig.from_dict(d)
    m = Trainer(cfg, world_of_one).run()
    assert m["steps"] == 5 and m["world_size"] == 1
    assert torch.isfinite(torch.tensor(m["final_loss"]))
    lrs = dict(m["lr_history"])  # the LR each optimizer step used: warmup over 2 steps
    assert lrs[1] == pytest.approx(0.005) and lrs[2] == pytest.approx(0.01) and lrs[5] < 0.01


def test_lr_schedules():
    assert [lr_multiplier("linear_warmup_cosine", 4, 12, s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_multiplier("linear_warmup_cosine", 4, 12, 8) == pytest.approx(0.5)
    assert lr_multiplier("cosine", 0, 10, 0) == 1.0 and lr_multiplier("cosine", 0, 10, 10) == 0.0
    assert lr_multiplier("constant", 0, 10, 7) == 1.0
    assert lr_multiplier("constant", 2, 10, 0) == 0.5


def test_finished_run_restarts_idempotently(problem, world_of_one):
    cfg, m1, w1 = _run(problem, world_of_one, "twice", max_steps=4)
    m2 = Trainer(cfg, world_of_one).run()
    assert m2["resumed_from_step"] == 4 and m2["steps_this_attempt"] == 0
    assert m2["final_loss"] == m1["final_loss"]
    # throughput figures are carried in the checkpoint, not lost with the first attempt
    for key in ("samples_per_second", "data_wait_share", "per_rank_step_time_s", "samples_seen"):
        assert m2[key] == m1[key], key
    w2 = load_file(f"{cfg.output_dir}/model.safetensors")
    for k in w1:
        assert torch.equal(w1[k], w2[k])


def test_checkpoint_past_the_configured_steps_is_refused(problem, world_of_one):
    root, manifest, locations = problem
    _run(problem, world_of_one, "shrunk", max_steps=4)
    d = make_config(root, manifest, locations, name="shrunk", max_steps=2)
    with pytest.raises(ConfigError, match="past this run's 2 steps"):
        Trainer(RunConfig.from_dict(d), world_of_one).run()


def test_progress_line_eta_uses_this_attempts_pace():
    from training_runtime.observe.telemetry import progress_line

    line = progress_line(epoch=2, epochs=5, step=60, total=100, start_step=50, loss=0.5,
                         samples_per_second=1000, elapsed_s=10.0)
    assert line.startswith("epoch 2/5 [############........] step 60/100 (60%) loss 0.5000")
    assert line.endswith("1,000 samples/s ETA 0:00:40")


def test_checkpoints_of_another_run_are_refused(problem, world_of_one):
    root, manifest, locations = problem
    cfg, _, _ = _run(problem, world_of_one, "other", max_steps=4)
    d = make_config(root, manifest, locations, name="other", max_steps=4, lr=0.5)
    with pytest.raises(ConfigError, match="holds checkpoints of a different run"):
        Trainer(RunConfig.from_dict(d), world_of_one).run()


def test_missing_shard_fails_before_training(problem, world_of_one, tmp_path):
    root, manifest, locations = problem
    locs = {**locations, "shards/train/00002.bin": (tmp_path / "gone.bin").as_uri()}
    cfg = RunConfig.from_dict(make_config(root, manifest, locs, name="missing"))
    with pytest.raises(DataError, match=r"shard 'shards/train/00002.bin' is missing"):
        Trainer(cfg, world_of_one).run()
    assert not (root / "missing").exists()


@pytest.mark.parametrize("change, env, message", [
    ({"model": {"name": "resnet50", "kwargs": {}}}, {}, "model.name 'resnet50' is unknown"),
    ({"train": {"batch_size": 15}}, {"WORLD_SIZE": "2"},
     "train.batch_size=15 is not divisible by world_size (2)"),
    ({"train": {"batch_size": 128}}, {"WORLD_SIZE": "128"}, "world_size 128 exceeds the 64 training"),
])
def test_entry_point_rejects_config_before_training(problem, tmp_path, monkeypatch, change, env, message):
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name="entry")
    for section, value in change.items():
        d[section].update(value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        main(["--config", str(path)])
    assert message in str(e.value)
    assert not (root / "entry").exists()


def test_resume_from_an_async_checkpoint_reproduces_the_run(problem, world_of_one, monkeypatch):
    """The async writer copies parameters and moments beside the next forward and backward; with
    that copy held back, the optimizer step must wait for it, or checkpoint 4 would hold step 5's
    weights and the resumed run would differ. The wait counts as checkpoint stall."""
    import shutil
    import time

    from training_runtime.checkpoint import staging

    # The wait is the hold less the forward and backward that overlap it, so hold far longer than
    # a step of this tiny model takes even on a loaded machine (0.25 s gave 0.196 s under test-all).
    run = staging.DeferredCopy.run
    monkeypatch.setattr(staging.DeferredCopy, "run", lambda self: (time.sleep(0.8), run(self)))
    cfg, m1, w1 = _run(problem, world_of_one, "async_resume", max_steps=6, num_workers=2,
                       checkpoint={"async_save": True})
    assert m1["checkpoint_stall_s_total"] >= 0.2  # at least step 5 waited for checkpoint 4's copy
    shutil.rmtree(f"{cfg.checkpoint.dir}/step_000000006")  # as if the last write never finished
    m2 = Trainer(cfg, world_of_one).run()
    assert m2["resumed_from_step"] == 4 and m2["steps_this_attempt"] == 2
    assert m2["final_loss"] == m1["final_loss"]
    w2 = load_file(f"{cfg.output_dir}/model.safetensors")
    for k in w1:
        assert torch.equal(w1[k], w2[k]), k


def test_guards_off_takes_the_same_update_as_guards_on(problem, world_of_one):
    """One ``_apply_update`` for both branches: with or without the guards, the same clipped
    optimizer steps and schedule give the same weights and learning rates."""
    on_cfg, on, w_on = _run(problem, world_of_one, "guards_on", max_steps=6, grad_clip_norm=0.05)
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name="guards_off", max_steps=6, grad_clip_norm=0.05)
    d["guards"] = {"enabled": False}
    off = Trainer(RunConfig.from_dict(d), world_of_one).run()
    w_off = load_file(f"{d['output_dir']}/model.safetensors")
    assert off["lr_history"] == on["lr_history"] and off["loss_history"] == on["loss_history"]
    for k in w_on:
        assert torch.equal(w_on[k], w_off[k]), k


def test_a_skipped_batch_leaves_only_its_own_step_out_of_the_interval_loss(problem, world_of_one):
    """Step 3's batch gives a NaN loss and is skipped; the interval of steps 3-4 reports step 4's
    loss, not NaN (the whole rank's interval used to be dropped)."""
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name="skip_one", epochs=3,  # 12 steps: intervals of 2
                    model="tests.runtime.user_model:nan_at_step", model_kwargs={"step": 3, "rank": 0})
    d["guards"] = {"nonfinite_skip_batches": 2}
    m = Trainer(RunConfig.from_dict(d), world_of_one).run()
    losses = dict(m["loss_history"])
    assert sorted(losses) == list(range(2, 13, 2))
    assert m["nonfinite_skipped"] == 1
    assert all(math.isfinite(v) for v in losses.values()), losses


def test_system_stats_are_read_only_where_telemetry_is_emitted(problem, world_of_one, monkeypatch):
    """8 steps are 8 boundaries (the progress line's 10%), but telemetry every 4 steps reads
    psutil (and NVML on GPUs) twice, and those two telemetry events carry the readings."""
    from training_runtime.observe.telemetry import SystemStats

    calls = []
    real = SystemStats.sample
    monkeypatch.setattr(SystemStats, "sample", lambda self: calls.append(1) or real(self))
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name="stats_calls")
    d["telemetry"] = {"every_steps": 4}
    events = []

    class Collect:
        def info(self, message):
            pass

        def custom(self, payload):
            events.append(payload)

    m = Trainer(RunConfig.from_dict(d), world_of_one, reporter=Collect()).run()
    assert m["steps"] == 8 and len(m["loss_history"]) == 8  # every step closed an interval
    telemetry = [e for e in events if e["kind"] == "telemetry"]
    assert [e["step"] for e in telemetry] == [4, 8] and all("rss_bytes" in e for e in telemetry)
    assert len(calls) == 2
