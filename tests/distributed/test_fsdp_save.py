"""An FSDP model's files are written a tensor at a time (training_runtime/checkpoint/weights.py):
the bytes are safetensors' own, the weights the trained ones, the best validation's weights are
kept as a safetensors file (never a gathered state dict) and the final save copies it; under
torchrun with 2 gloo ranks the gathered tensors are the whole model's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tests.runtime.helpers import make_config, make_dataset, torchrun
from training_runtime.checkpoint import full as ckpt
from training_runtime.checkpoint.weights import write_safetensors
from training_runtime.config import RunConfig
from training_runtime.serve.card import SAFETENSORS_METADATA, _storable
from training_runtime.train.trainer import Trainer

TEAM_NET = "tests.distributed.user_blocks:team_net"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-save")
    manifest, locations = make_dataset(root, n_train=64, n_test=16, per_shard=32)
    return root, manifest, locations


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_streamed_weights_are_the_bytes_safetensors_writes(tmp_path):
    model = nn.Sequential(nn.Embedding(10, 4), nn.BatchNorm1d(4), nn.Linear(4, 10), nn.Linear(0, 3))
    model[2].weight = model[0].weight  # tied: stored once, the second name refers to the first
    model.register_buffer("mask", torch.ones(3, dtype=torch.bool))
    model.register_buffer("bf16", torch.randn(5).to(torch.bfloat16))
    state = model.state_dict()
    tensors, shared = _storable(state)
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata=SAFETENSORS_METADATA)
    streamed, sha = write_safetensors(tmp_path / "streamed.safetensors", state, SAFETENSORS_METADATA, writer=True)
    assert (tmp_path / "streamed.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    assert streamed == shared == {"2.weight": "0.weight"}
    assert sha == _sha(tmp_path / "streamed.safetensors")
    assert write_safetensors(tmp_path / "elsewhere.safetensors", state, SAFETENSORS_METADATA, writer=False) == \
        (shared, None) and not (tmp_path / "elsewhere.safetensors").exists()


class _Sharded:
    """A DTensor's face as write_safetensors reads it: ``detach()`` makes a new object each call, as
    FSDP2's ``state_dict()`` does, so an ``id()`` names a temporary that is freed at once."""

    def __init__(self, local: torch.Tensor):
        self.local, self.shape, self.dtype = local, local.shape, local.dtype

    def detach(self):
        return _Sharded(self.local)

    def to_local(self):
        return self.local

    def full_tensor(self):
        return self.local

    def numel(self):
        return self.local.numel()


def test_sharded_entries_are_told_apart_by_storage_and_ties_found():
    """The ranks' stored lists must agree (every gather is a collective): an id() of the detached
    temporaries was reused from one entry to the next, so a rank took some tensors for ties of
    others and skipped their gathers, and gloo paired buffers of different tensors."""
    from training_runtime.checkpoint.weights import stored_and_shared

    tied = torch.randn(4, 3)
    state = {f"w{i}": _Sharded(torch.randn(4, 3)) for i in range(6)}
    state["head"] = _Sharded(tied)
    state["embed"] = _Sharded(tied)
    state["empty"] = _Sharded(torch.empty(0, 3))
    stored, shared = stored_and_shared(state)
    assert shared == {"embed": "head"}
    assert list(stored) == [*(f"w{i}" for i in range(6)), "head", "empty"]


def _run(data, name: str, sharding: str, info, **validation):
    d = make_config(*data, name=name, model=TEAM_NET, model_kwargs={"width": 16, "blocks": 2}, sharding=sharding,
                    **({"fsdp_units": "TeamBlock"} if sharding == "fsdp" else {}))
    d["validation"] = {"every_steps": 2, **validation}
    Trainer(RunConfig.from_dict(d), info).run()
    return d


def test_an_fsdp_runs_model_file_holds_the_weights_a_ddp_run_trains(data, world_of_one):
    fsdp = _run(data, "fsdp-last", "fsdp", world_of_one, keep_best=False)
    ddp = _run(data, "ddp-last", "ddp", world_of_one, keep_best=False)
    a, b = load_file(f"{fsdp['output_dir']}/model.safetensors"), load_file(f"{ddp['output_dir']}/model.safetensors")
    assert a.keys() == b.keys() and any("blocks.1.mlp" in k for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    card = json.loads(Path(fsdp["output_dir"], "model_card.json").read_text())
    assert card["weights"]["sha256"] == _sha(Path(fsdp["output_dir"], "model.safetensors"))


def test_the_best_weights_under_fsdp_are_a_safetensors_file_the_final_save_copies(data, world_of_one):
    d = _run(data, "fsdp-best", "fsdp", world_of_one, keep_best=True)
    card = json.loads(Path(d["output_dir"], "model_card.json").read_text())
    best = ckpt.list_checkpoints(Path(d["checkpoint"]["dir"]) / "best")
    assert len(best) == 1  # only the newest best is kept
    step, path = best[0]
    assert card["training"]["weights_from_step"] == step
    ckpt.verify_checkpoint(path)  # the weights file is in the manifest, checked like the state
    state = ckpt.load_state(path)
    assert "model" not in state and state["weights_file"] == "model.safetensors"
    assert _sha(path / "model.safetensors") == _sha(Path(d["output_dir"], "model.safetensors")) == \
        card["weights"]["sha256"]


def test_two_fsdp_ranks_write_the_whole_model_once(data):
    """Real torchrun, 2 gloo ranks: every tensor gathered from both ranks' shards, in one order."""
    root, manifest, locations = data
    runs = {}
    for sharding in ("fsdp", "ddp"):
        cfg = make_config(root, manifest, locations, name=f"two-{sharding}", model=TEAM_NET,
                          model_kwargs={"width": 16, "blocks": 2}, sharding=sharding)
        cfg["validation"] = {"keep_best": False}
        proc = torchrun(cfg, root / f"two-{sharding}.json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[sharding] = load_file(f"{cfg['output_dir']}/model.safetensors")
    assert runs["fsdp"].keys() == runs["ddp"].keys()
    for k, v in runs["fsdp"].items():
        torch.testing.assert_close(v, runs["ddp"][k], rtol=1e-4, atol=1e-5)


def test_two_ranks_with_units_keep_their_best_weights_and_save_them(data):
    """2 gloo ranks, a unit per block (so every block's parameters are DTensors to gather), keep_best:
    the best weights' file is written in step by both ranks while rank 0 writes, and copied."""
    root, manifest, locations = data
    cfg = make_config(root, manifest, locations, name="two-units", model=TEAM_NET,
                      model_kwargs={"width": 64, "blocks": 4}, sharding="fsdp", fsdp_units="TeamBlock")
    cfg["validation"] = {"every_steps": 2, "keep_best": True}
    proc = torchrun(cfg, root / "two-units.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = json.loads(Path(cfg["output_dir"], "model_card.json").read_text())
    (step, best), = ckpt.list_checkpoints(Path(cfg["checkpoint"]["dir"]) / "best")
    assert card["training"]["weights_from_step"] == step
    assert _sha(best / "model.safetensors") == card["weights"]["sha256"]
    weights = load_file(f"{cfg['output_dir']}/model.safetensors")
    assert weights["blocks.3.mlp.0.weight"].shape == (256, 64)  # whole, not a rank's shard
