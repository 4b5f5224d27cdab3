"""End-to-end runs under real ``torchrun`` with 2 gloo ranks on a tiny synthetic problem."""

import copy
import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file

from training_runtime.serve.evaluate import evaluate
from tests.runtime.helpers import judged, make_config as _make_config, make_dataset, registered_sha256, torchrun

pytestmark = pytest.mark.slow

TOTAL_STEPS = 24  # 192 samples, global batch 16, 2 epochs
EVERY = 4


def make_config(*args, **kwargs):
    """helpers.make_config at a learning rate with which 24 steps of this problem learn it well past
    chance whatever the epoch's sample order draws (at 0.01 the test accuracy sat near 0.5)."""
    return _make_config(*args, **{"lr": 0.03, **kwargs})


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    manifest, locations = make_dataset(root)
    return root, manifest, locations


@pytest.fixture(scope="module")
def baseline(problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="baseline")
    proc = torchrun(cfg, root / "baseline.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cfg, proc


def _out(cfg):
    from pathlib import Path
    return Path(cfg["output_dir"])


def _weights(cfg):
    return load_file(_out(cfg) / "model.safetensors")


def _metrics(cfg):
    return json.loads((_out(cfg) / "metrics.json").read_text())


def _assert_same_weights(a, b, exact=False):
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_outputs_metrics_and_evaluation(baseline, problem):
    cfg, proc = baseline
    _, manifest, locations = problem
    m = _metrics(cfg)
    for key in ("final_loss", "samples_per_second", "data_wait_share", "steps", "epochs", "world_size",
                "backend", "loss_history", "lr_history", "per_rank_step_time_s",
                "checkpoint_stall_s_total", "resumed_from_step"):
        assert key in m, key
    assert m["steps"] == TOTAL_STEPS and m["epochs"] == 2 and m["world_size"] == 2
    assert m["backend"] == "gloo" and m["resumed_from_step"] is None
    # a clean run raises no false alarm (the timing warnings aside: two busy cores can starve any loader)
    assert judged(m["detections"]) == [] and m["nonfinite_skipped"] == 0
    assert len(m["per_rank_step_time_s"]) == 2 and 0 <= m["data_wait_share"] <= 1
    assert m["loss_history"][-1][0] == TOTAL_STEPS
    assert m["loss_history"][-1][1] < m["loss_history"][0][1]  # it learns
    lrs = [lr for _, lr in m["lr_history"]]
    assert lrs == sorted(lrs, reverse=True)  # cosine decay
    resolved = json.loads((_out(cfg) / "resolved_config.json").read_text())
    assert resolved["world_size"] == 2 and resolved["backend"] == "gloo" and resolved["device"] == "cpu"
    assert resolved["train"] == cfg["train"] | {k: resolved["train"][k] for k in resolved["train"]
                                                if k not in cfg["train"]}
    assert "step 24/24 (100%)" in proc.stderr  # the rank-0 progress line
    ckpts = sorted(p.name for p in (_out(cfg).parent / "ckpt").iterdir())
    # keep_last 3, and the best validation's weights (keep_best) in a checkpoint of their own
    assert ckpts == ["best", "step_000000016", "step_000000020", "step_000000024"]
    best = [p.name for p in (_out(cfg).parent / "ckpt" / "best").iterdir()]
    assert best == [f"step_{m['best_step']:09d}"] and m["best_step"] in (12, 24)  # validated at each epoch's end
    res = evaluate(_out(cfg), manifest, locations, split="test")
    assert res["num_samples"] == 64 and res["accuracy"] > 0.5  # 4 classes: chance is 0.25


def test_identical_runs_end_with_identical_weights(baseline, problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="again", checkpoint={"async_save": True})
    proc = torchrun(cfg, root / "again.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_same_weights(_weights(baseline[0]), _weights(cfg), exact=True)
    assert _metrics(cfg)["final_loss"] == _metrics(baseline[0])["final_loss"]


def test_resume_after_sigkill_matches_uninterrupted_run(baseline, problem):
    root, manifest, locations = problem
    seed = random.randrange(1 << 30)
    kill_step = random.Random(seed).randint(2, TOTAL_STEPS - 1)
    cfg = make_config(root, manifest, locations, name="killed")
    proc = torchrun(cfg, root / "killed.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"1:{kill_step}"})
    assert proc.returncode == 0, f"kill step {kill_step} (seed {seed}): {proc.stderr[-4000:]}"
    m = _metrics(cfg)
    resumed = m["resumed_from_step"] or 0  # None: killed before the first checkpoint
    assert m["restart_count"] == 1, f"kill step {kill_step}"
    assert 0 <= kill_step - resumed <= EVERY, (kill_step, resumed)
    assert m["steps"] == TOTAL_STEPS and m["steps_this_attempt"] == TOTAL_STEPS - resumed
    # Same ranks, same shards, same reduction order on gloo: the same weights, so the same bytes.
    _assert_same_weights(_weights(baseline[0]), _weights(cfg), exact=True)
    assert registered_sha256(_out(cfg)) == registered_sha256(_out(baseline[0])), f"kill step {kill_step}"


def test_fsdp_matches_ddp_and_skips_a_corrupt_checkpoint_on_resume(baseline, problem):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="fsdp", sharding="fsdp")
    proc = torchrun(cfg, root / "fsdp.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _metrics(cfg)["final_loss"] == pytest.approx(_metrics(baseline[0])["final_loss"], rel=1e-5)
    _assert_same_weights(_weights(baseline[0]), _weights(cfg))

    # Resume an FSDP run from its checkpoints with the newest one corrupted.
    cfg2 = copy.deepcopy(cfg)
    cfg2["checkpoint"]["dir"] = str(root / "fsdp_resume" / "ckpt")
    cfg2["output_dir"] = str(root / "fsdp_resume" / "out")
    shutil.copytree(cfg["checkpoint"]["dir"], cfg2["checkpoint"]["dir"])
    newest = root / "fsdp_resume" / "ckpt" / "step_000000024" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:-100])
    proc = torchrun(cfg2, root / "fsdp_resume.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "skipping corrupt checkpoint" in proc.stderr and "step_000000024" in proc.stderr
    assert _metrics(cfg2)["resumed_from_step"] == 20
    _assert_same_weights(_weights(cfg), _weights(cfg2))


def test_checksum_mismatch_fails_the_gang_before_the_first_step(problem):
    root, manifest, locations = problem
    bad = root / "corrupt" / "00000.bin"
    bad.parent.mkdir(exist_ok=True)
    raw = bytearray((root / "shards/train/00000.bin").read_bytes())
    raw[100] ^= 0xFF
    bad.write_bytes(bytes(raw))
    locs = {**locations, "shards/train/00000.bin": bad.as_uri()}
    cfg = make_config(root, manifest, locs, name="bad_checksum")
    proc = torchrun(cfg, root / "bad_checksum.json")
    assert proc.returncode != 0
    assert "checksum mismatch for shard 'shards/train/00000.bin'" in proc.stderr, proc.stderr[-4000:]
    # Shards stream: a shard is verified when its rank first reads it, so the rank whose first load
    # holds it fails there, before any step, and torchrun stops the gang (rank 1 does not hang).
    assert "loading batches 0-" in proc.stderr and "CorruptShardError" in proc.stderr
    assert "step 1/" not in proc.stderr  # no step was taken
    assert not _out(cfg).exists()


def _user_config(problem, name: str, **ckpt):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name=name, checkpoint=ckpt)
    cfg["train_fn"] = "tests.runtime.user_train:main"
    return cfg


def test_a_user_training_function_resumes_after_sigkill_to_the_uninterrupted_weights(problem):
    root = problem[0]
    whole = _user_config(problem, "user_whole")
    assert (proc := torchrun(whole, root / "user_whole.json")).returncode == 0, proc.stderr[-4000:]
    killed = _user_config(problem, "user_killed")
    proc = torchrun(killed, root / "user_killed.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": "1:6"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = _metrics(killed)
    assert m["restart_count"] == 1 and m["resumed_from_step"] == 4 and m["steps"] == TOTAL_STEPS
    _assert_same_weights(_weights(whole), _weights(killed), exact=True)
    assert registered_sha256(_out(killed)) == registered_sha256(_out(whole))


def test_a_user_function_killed_before_its_first_checkpoint_fails_and_says_so(problem):
    root = problem[0]
    cfg = _user_config(problem, "user_no_ckpt", every_steps=1000)
    proc = torchrun(cfg, root / "user_no_ckpt.json", max_restarts=1, env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": "0:3"})
    assert proc.returncode != 0
    assert "saved no checkpoint" in proc.stderr and "ctx.save_checkpoint" in proc.stderr


def test_hsdp_with_deterministic_kernels_and_clipping_trains_like_ddp(baseline, problem):
    """HSDP on one node (mesh 1 x 2: replicate x shard) under deterministic kernels matches DDP;
    a clip norm above every gradient's norm leaves the updates alone while reporting the norm."""
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name="hsdp", sharding="hsdp",
                      deterministic=True, grad_clip_norm=1e6, collective_timeout_s=120.0)
    cfg["guards"] = {"hang_timeout_s": 60.0}  # below the collective timeout, as config requires
    proc = torchrun(cfg, root / "hsdp.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _metrics(cfg)["sharding"] == "hsdp"
    _assert_same_weights(_weights(baseline[0]), _weights(cfg))
    assert '"grad_norm"' in proc.stderr  # the telemetry lines carry the gradient norm
