"""Runs under real ``torchrun`` that start on 4 gloo ranks, are killed mid-epoch after a checkpoint
and resume on 2 (or 4): the epoch goes on in the same order (no sample repeated or skipped), and
the weights are those of an uninterrupted 4-rank run up to the floating-point order of the
gradient average's sums."""

from __future__ import annotations

import copy
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.runtime.helpers import make_config, make_id_dataset, torchrun
from tests.runtime.sample_order_train import ID_SCALE
from training_runtime.data.sampling import epoch_order, rank_epoch_indices, span_starts

pytestmark = pytest.mark.slow

N, PER_SHARD, BATCH = 190, 19, 16  # 10 shards; 12 steps an epoch, the last 14 samples padded to 16
STEPS_PER_EPOCH, TOTAL_STEPS = 12, 24
EVERY, KILL_AT = 4, 6  # killed mid-epoch 0, two steps after checkpoint 4
# 4 -> 2 ranks: every step averages the same 16 samples' gradients, summed in another order
# (two partial sums of 8, not four of 4); over 24 Adam steps that moves weights by ~1e-7.
RTOL, ATOL = 1e-4, 1e-5
SAME_ATOL = 1e-6  # 4 -> 4 ranks: measured 3e-8


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    """A learnable problem whose feature 0 is the sample's index / ID_SCALE (so batches say which
    samples they hold)."""
    root = tmp_path_factory.mktemp("sample_order")
    manifest, locations = make_id_dataset(root, N, PER_SHARD, 40, ID_SCALE)
    return root, manifest, locations


def _config(problem, name, train_fn=None):
    root, manifest, locations = problem
    cfg = make_config(root, manifest, locations, name=name, batch_size=BATCH)
    cfg["checkpoint"]["every_steps"] = EVERY
    cfg["train_fn"] = train_fn
    return cfg


def _run(cfg, path, nproc, **kw):
    proc = torchrun(cfg, path, nproc=nproc, timeout=300, **kw)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _kill_then_resume(problem, name, first, then, train_fn=None):
    """A run on ``first`` ranks SIGKILLed after step KILL_AT (torchrun gives up), then launched
    again, as a retry, on each world size in ``then`` from a copy of its checkpoints."""
    root = problem[0]
    cfg = _config(problem, name, train_fn)
    proc = torchrun(cfg, root / f"{name}.json", nproc=first, timeout=300,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"1:{KILL_AT}"})
    assert proc.returncode != 0, "the kill did not stop the run"
    assert sorted(p.name for p in Path(cfg["checkpoint"]["dir"]).glob("step_*")) == [
        "step_000000004"], proc.stderr[-4000:]
    resumed = []
    for world in then:
        again = copy.deepcopy(cfg)
        again.update(output_dir=str(root / f"{name}_to{world}" / "out"), launch=2)
        again["checkpoint"]["dir"] = str(root / f"{name}_to{world}" / "ckpt")
        shutil.copytree(cfg["checkpoint"]["dir"], again["checkpoint"]["dir"])
        if (seen := Path(cfg["checkpoint"]["dir"]).parent / "seen").exists():
            shutil.copytree(seen, Path(again["checkpoint"]["dir"]).parent / "seen")
        proc = _run(again, root / f"{name}_to{world}.json", world)
        resumed.append((again, proc))
    return cfg, resumed


def _weights(cfg):
    return load_file(Path(cfg["output_dir"]) / "model.safetensors")


def _metrics(cfg):
    return json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())


def _seen(cfg):
    """Every step each process recorded: (world, rank, step, resumed_from, ids)."""
    rows = []
    for path in (Path(cfg["checkpoint"]["dir"]).parent / "seen").glob("*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def _epoch_samples(rows, resumed_at):
    """The samples epoch 0 trained on: the killed attempt's steps up to the checkpoint it was
    resumed from, then the resumed attempt's (which redo the steps after it)."""
    killed = [r for r in rows if r["resumed_from"] is None and r["step"] <= resumed_at]
    after = [r for r in rows if r["resumed_from"] == resumed_at and r["step"] <= STEPS_PER_EPOCH]
    return killed, after


def test_a_run_killed_on_4_ranks_resumes_on_2_with_the_rest_of_the_epoch(problem):
    """The ids a team's training function sees: the killed 4-rank attempt's steps 1-4 and the
    resumed 2-rank attempt's 5-12 hold each sample once and the two padded ones twice: the
    multiset of an uninterrupted 4-rank run's epoch, step by step the same samples."""
    root, manifest, _ = problem
    fn = "tests.runtime.sample_order_train:main"
    whole = _config(problem, "ids_whole", fn)
    _run(whole, root / "ids_whole.json", 4)
    _, [(resumed, proc)] = _kill_then_resume(problem, "ids", 4, [2], fn)
    assert "was written by 4 ranks, this run has 2: the same sample order continues (data.partitions=4)" \
        in proc.stderr, proc.stderr[-4000:]

    rows = _seen(resumed)
    before, after = _epoch_samples(rows, EVERY)
    assert {(r["world"], r["step"]) for r in before} == {(4, s) for s in range(1, EVERY + 1)}
    assert {(r["world"], r["step"]) for r in after} == {(2, s) for s in range(EVERY + 1, STEPS_PER_EPOCH + 1)}
    assert any(r["resumed_from"] is None and r["step"] > EVERY for r in rows)  # the killed attempt went past 4
    sizes = [s["num_samples"] for s in manifest["splits"]["train"]["shards"]]
    order, bounds = epoch_order(sizes, 0, 0, 4), span_starts(N, 4)
    epoch = Counter(i for r in before + after for i in r["ids"])
    assert set(epoch) == set(range(N)) and sum(epoch.values()) == N + 2  # 190 padded to 192 (gcd(16, 4))
    # padded positions 190 and 191 take the last samples of spans 190 % 4 and 191 % 4
    assert sorted(i for i, c in epoch.items() if c == 2) == sorted([order[bounds[3] - 1], order[bounds[4] - 1]])

    uninterrupted = [r for r in _seen(whole) if r["step"] <= STEPS_PER_EPOCH]
    assert Counter(i for r in uninterrupted for i in r["ids"]) == epoch

    def by_step(rs):
        steps: dict[int, Counter] = {}
        for r in rs:
            steps.setdefault(r["step"], Counter()).update(r["ids"])
        return steps
    assert by_step(before + after) == by_step(uninterrupted)

    # and it is the documented order: each rank's ids are rank_epoch_indices', from its own spans
    span = dict(zip(order.tolist(), (np.searchsorted(bounds, np.arange(N), side="right") - 1).tolist()))
    for rank in (0, 1):
        mine = [r for r in after if r["rank"] == rank]
        expect = rank_epoch_indices(sizes, 0, 0, 4, 2, rank, BATCH, 4)[EVERY * 8:]
        assert sorted(i for r in mine for i in r["ids"]) == sorted(expect.tolist())
        assert {span[i] % 2 for r in mine for i in r["ids"]} == {rank}


def test_the_built_in_trainer_resumed_on_2_or_4_ranks_ends_with_the_4_rank_weights(problem):
    """Killed on 4 ranks after step 6, resumed from checkpoint 4, on 4 ranks and on 2: the weights
    of the uninterrupted 4-rank run up to the reduction order of the gradient average. On 4 ranks
    that is about one float32 ulp (SAME_ATOL): a 4-rank gloo resume was not bit-exact before this
    order either (measured on 4420457 with a torchrun restart: 3e-8), while a 2-rank one is
    (tests/runtime/test_torchrun.py), two-term sums being exact in any order."""
    root = problem[0]
    whole = _config(problem, "whole")
    _run(whole, root / "whole.json", 4)
    _, [(same, _), (half, _)] = _kill_then_resume(problem, "killed", 4, [4, 2])
    base = _weights(whole)
    for cfg in (same, half):
        m = _metrics(cfg)
        assert m["resumed_from_step"] == EVERY and m["steps"] == TOTAL_STEPS
    same_w, half_w = _weights(same), _weights(half)
    assert base.keys() == same_w.keys() == half_w.keys()
    for k in base:
        torch.testing.assert_close(same_w[k], base[k], rtol=0, atol=SAME_ATOL)
        torch.testing.assert_close(half_w[k], base[k], rtol=RTOL, atol=ATOL)
    resolved = json.loads((Path(half["output_dir"]) / "resolved_config.json").read_text())
    assert resolved["data"]["partitions"] == 4 and resolved["world_size"] == 2  # P of the first launch


def test_a_world_size_that_does_not_divide_the_checkpoints_partitions_is_refused(problem):
    """Started on 2 ranks (P=2), killed, relaunched on 4: refused before any step, naming
    data.partitions and the world sizes that fit."""
    root = problem[0]
    cfg = _config(problem, "p2")
    proc = torchrun(cfg, root / "p2.json", nproc=2, timeout=300,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"1:{KILL_AT}"})
    assert proc.returncode != 0
    again = {**cfg, "launch": 2}
    proc = torchrun(again, root / "p2_again.json", nproc=4, timeout=300)
    assert proc.returncode != 0
    assert "world size 4 does not divide data.partitions of checkpoint" in proc.stderr, proc.stderr[-4000:]
    assert "=2, the canonical partitions of this run's sample order: run it on [1, 2] ranks" in proc.stderr
    assert "data.partitions=12" in proc.stderr
    assert not (Path(cfg["output_dir"]) / "model.safetensors").exists()
