"""Sharded (torch.distributed.checkpoint) checkpoints under FSDP: settings, layout, sha256
verification with fallback, keep_last, resume from full checkpoints (in-process, one rank), and
under real torchrun with 2 gloo ranks: each rank writes only its shards, a kill resumes to the
uninterrupted weights, and a 2-rank checkpoint resumes at 1 rank."""

import json
import logging
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training_runtime.checkpoint import full as ckpt
from training_runtime.config import CheckpointConfig, ConfigError, RunConfig
from training_runtime.train.trainer import Trainer
from tests.runtime.helpers import make_config, make_dataset, registered_sha256, torchrun


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    manifest, locations = make_dataset(root, n_train=64, n_test=16, feature_shape=(16,), per_shard=20)
    return root, manifest, locations


def _config(problem, name, *, checkpoint=None, **train):
    root, manifest, locations = problem
    d = make_config(root, manifest, locations, name=name, sharding="fsdp",
                    checkpoint={"every_steps": 4, **(checkpoint or {})}, **train)
    d["validation"] = {"keep_best": False}  # the exported weights are the last step's: what a resume loaded
    return d


def _train(d, info):
    return Trainer(RunConfig.from_dict(d), info).run(), load_file(f"{d['output_dir']}/model.safetensors")


def _steps(d) -> list[int]:
    return sorted(s for s, _ in ckpt.list_checkpoints(d["checkpoint"]["dir"]))


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize("sharding, checkpoint, message", [
    ("ddp", {"format": "sharded"}, "checkpoint.format 'sharded' saves FSDP shards, but train.sharding is 'ddp'"),
    ("fsdp", {"format": "sharded", "async_save": True}, "cannot be combined with checkpoint.async_save"),
    ("fsdp", {"format": "dcp"}, "checkpoint.format must be one of ['auto', 'full', 'sharded'], got 'dcp'"),
    ("fsdp", {"format": "sharded", "train_fn": True}, "a train_fn saves what it hands ctx.save_checkpoint"),
])
def test_bad_checkpoint_format_settings_name_the_fields(problem, sharding, checkpoint, message):
    root, manifest, locations = problem
    checkpoint = dict(checkpoint)
    train_fn = checkpoint.pop("train_fn", False)
    d = make_config(root, manifest, locations, name="bad_format", sharding=sharding, checkpoint=checkpoint)
    if train_fn:
        d["train_fn"] = "tests.runtime.user_train:main"
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(d)
    assert message in str(e.value)


def test_auto_is_sharded_under_fsdp_and_hsdp_unless_writes_are_async():
    auto = CheckpointConfig(dir="/c")
    assert [auto.resolved_format(s) for s in ("ddp", "fsdp", "hsdp")] == ["full", "sharded", "sharded"]
    assert CheckpointConfig(dir="/c", async_save=True).resolved_format("fsdp") == "full"
    assert CheckpointConfig(dir="/c", format="full").resolved_format("fsdp") == "full"


# ---------------------------------------------------------------- one rank, in-process
def test_layout_manifest_and_keep_last(problem, world_of_one):
    d = _config(problem, "layout", checkpoint={"every_steps": 2, "keep_last": 2})
    _train(d, world_of_one)
    assert _steps(d) == [6, 8]  # keep_last 2 of the checkpoints at 2, 4, 6, 8
    root = Path(d["checkpoint"]["dir"])
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporaries left
    path = root / "step_000000008"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == ckpt.SHARDED_FORMAT
    on_disk = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert sorted(manifest["files"]) == on_disk  # every file is in the manifest
    assert "dcp/.metadata" in on_disk and any(n.startswith("dcp/__0_") for n in on_disk)
    ckpt.verify_checkpoint(path)
    state = ckpt.load_state(path)
    assert state["step"] == 8 and state["sharded"] == "dcp"
    assert "model" not in state and "optimizer" not in state  # those are the shards


def test_a_damaged_shard_is_caught_by_sha256_and_the_previous_checkpoint_resumes(problem, world_of_one, caplog):
    whole = _config(problem, "whole")
    m1, w1 = _train(whole, world_of_one)
    assert _steps(whole) == [4, 8]
    damaged = _config(problem, "damaged")
    shutil.copytree(whole["checkpoint"]["dir"], damaged["checkpoint"]["dir"])
    shard = next((Path(damaged["checkpoint"]["dir"]) / "step_000000008" / "dcp").glob("__0_*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the hash tells
    shard.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        m2, w2 = _train(damaged, world_of_one)
    assert f"step_000000008: dcp/{shard.name} sha256" in caplog.text
    assert m2["resumed_from_step"] == 4 and m2["steps_this_attempt"] == 4
    assert m2["loss_history"] == m1["loss_history"]
    _assert_equal(w1, w2)  # the model and Adam state came back exactly


def test_a_full_checkpoint_resumes_a_sharded_run(problem, world_of_one):
    full = _config(problem, "was_full", checkpoint={"format": "full"})
    m1, w1 = _train(full, world_of_one)
    shutil.rmtree(Path(full["checkpoint"]["dir"]) / "step_000000008")
    sharded = _config(problem, "was_full", checkpoint={"format": "sharded"})  # the same directory
    m2, w2 = _train(sharded, world_of_one)
    assert m2["resumed_from_step"] == 4
    assert "sharded" in ckpt.load_state(Path(sharded["checkpoint"]["dir"]) / "step_000000008")
    _assert_equal(w1, w2)


def test_a_sharded_checkpoint_resumes_a_ddp_run(problem, world_of_one):
    """train.sharding may change on resume (RESUMABLE_CHANGES): DCP loads the shards into a DDP model."""
    fsdp = _config(problem, "to_ddp")
    m1, w1 = _train(fsdp, world_of_one)
    shutil.rmtree(Path(fsdp["checkpoint"]["dir"]) / "step_000000008")
    ddp = {**fsdp, "train": {**fsdp["train"], "sharding": "ddp"}}
    m2, w2 = _train(ddp, world_of_one)
    assert m2["resumed_from_step"] == 4 and m2["sharding"] == "ddp"
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- torchrun, 2 gloo ranks
TOTAL_STEPS = 12  # 96 samples, global batch 16, 2 epochs; checkpoints at 4, 8, 12
BIG = {"hidden_sizes": [256, 256]}  # 70k parameters: shards well above DCP's ~1.5 kB per tensor


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded_torchrun")
    manifest, locations = make_dataset(root, n_train=96, n_test=32, per_shard=32)
    cfg = _torchrun_config(root, manifest, locations, "baseline")
    proc = torchrun(cfg, root / "baseline.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root, manifest, locations, cfg


def _torchrun_config(root, manifest, locations, name):
    cfg = make_config(root, manifest, locations, name=name, sharding="fsdp", model_kwargs=BIG)
    cfg["validation"] = {"keep_best": False}
    return cfg


@pytest.mark.slow
def test_each_rank_writes_only_its_own_shards(two_ranks):
    cfg = two_ranks[3]
    final = load_file(Path(cfg["output_dir"]) / "model.safetensors")
    full_bytes = 3 * sum(t.numel() * t.element_size() for t in final.values())  # weights + Adam's two moments
    path = Path(cfg["checkpoint"]["dir"]) / "step_000000012"
    per_rank = {r: sum(p.stat().st_size for p in (path / "dcp").glob(f"__{r}_*.distcp")) for r in (0, 1)}
    # Where DCP put each piece: every weight and Adam moment in two halves, rank r's half (rows
    # from r * rows / 2) in rank r's file.
    from torch.distributed.checkpoint import FileSystemReader

    pieces = {}
    for idx, where in FileSystemReader(str(path / "dcp")).read_metadata().storage_data.items():
        if idx.offset is not None and len(idx.offset) and not idx.fqn.endswith(".step"):
            pieces.setdefault(idx.fqn, []).append((where.relative_path.split("_")[2], idx.offset[0]))
    assert len(pieces) == 3 * len(final)  # model.*, exp_avg, exp_avg_sq of each parameter
    for fqn, held in pieces.items():
        rows = final[fqn.removeprefix("model.").split(".exp_avg")[0].removeprefix("optimizer.state.")].shape[0]
        assert sorted(held) == [("0", 0), ("1", rows // 2)], (fqn, held)
    # Each rank's files hold about half the state (FSDP shards dim 0 over 2 ranks), none all of it.
    for r, size in per_rank.items():
        assert 0.35 * full_bytes < size < 0.65 * full_bytes, (r, size, full_bytes)
    assert (path / "state.pt").stat().st_size < 0.05 * full_bytes  # rank 0's own file: no weights


@pytest.mark.slow
def test_a_kill_resumes_from_sharded_checkpoints_to_the_uninterrupted_weights(two_ranks):
    root, manifest, locations, baseline = two_ranks
    seed = random.randrange(1 << 30)
    kill_step = random.Random(seed).randint(5, TOTAL_STEPS - 1)  # after the first checkpoint (4)
    cfg = _torchrun_config(root, manifest, locations, "killed")
    proc = torchrun(cfg, root / "killed.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"1:{kill_step}"})
    assert proc.returncode == 0, f"kill step {kill_step} (seed {seed}): {proc.stderr[-4000:]}"
    m = json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())
    assert m["restart_count"] == 1 and 0 <= kill_step - m["resumed_from_step"] <= 4, (kill_step, m["resumed_from_step"])
    # Same ranks, same shards, same reduction order on gloo: bit-identical.
    _assert_equal(load_file(Path(baseline["output_dir"]) / "model.safetensors"),
                  load_file(Path(cfg["output_dir"]) / "model.safetensors"))
    assert registered_sha256(cfg["output_dir"]) == registered_sha256(baseline["output_dir"])


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_rank(two_ranks, world_of_one, caplog):
    """DCP reshards: the one rank (in-process here) reads both ranks' halves of every tensor."""
    root, manifest, locations, baseline = two_ranks
    cfg = _torchrun_config(root, manifest, locations, "one_rank")
    shutil.copytree(baseline["checkpoint"]["dir"], cfg["checkpoint"]["dir"])
    shutil.rmtree(Path(cfg["checkpoint"]["dir"]) / "step_000000012")
    with caplog.at_level(logging.WARNING):
        m = Trainer(RunConfig.from_dict(cfg), world_of_one).run()
    assert m["resumed_from_step"] == 8 and m["world_size"] == 1 and m["steps"] == TOTAL_STEPS
    assert "written by 2 ranks, this run has 1" in caplog.text
    # One rank sees each step's 16 samples as the two ranks together did, so the last 4 steps land
    # where the 2-rank run's did, up to float summation order.
    a = load_file(Path(baseline["output_dir"]) / "model.safetensors")
    b = load_file(Path(cfg["output_dir"]) / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_a_crash_before_publishing_leaves_the_published_checkpoints_alone(problem, world_of_one):
    """Shards on disk, then the process dies (here: raises) before the manifest and rename: the
    temporary directory is all that is left, and the next start clears it."""
    from training_runtime.checkpoint import sharded as sharded_checkpoint
    from training_runtime.distributed.fsdp import wrap_model
    from training_runtime.models.builtin import build_model

    root = problem[0] / "crash"
    model = wrap_model(build_model("mlp", [16], 4, hidden_sizes=[8]), "fsdp", world_of_one)
    opt = torch.optim.AdamW(model.parameters())
    sharded_checkpoint.save_sharded(root, 1, model, opt, {"step": 1, "sharded": "dcp"}, world_of_one, keep_last=2)

    def crash(step):
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        sharded_checkpoint.save_sharded(root, 2, model, opt, {"step": 2, "sharded": "dcp"}, world_of_one,
                                        keep_last=2, before_publish=crash)
    assert _steps({"checkpoint": {"dir": root}}) == [1]
    assert (sharded_checkpoint.temporary_dir(root, 2) / "dcp" / ".metadata").is_file()
    ckpt.remove_stale_temporaries(root)
    assert sorted(p.name for p in root.iterdir()) == ["step_000000001"]
    assert ckpt.find_latest_valid(root)[1]["step"] == 1
