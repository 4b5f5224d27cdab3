"""Full-state helpers: the DDP path writes the same format as DCP's full_state_dict helpers, and
DDP and FSDP models load each other's state."""

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from training_runtime.checkpoint.staging import copy_to_cpu
from training_runtime.distributed.fsdp import full_model_state, full_optimizer_state, load_full_state, wrap_model
from training_runtime.models.builtin import build_model


def _trained(sharding, info, seed=0):
    torch.manual_seed(seed)
    model = wrap_model(build_model("mlp", [6], 3, hidden_sizes=[5]), sharding, info)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    for _ in range(2):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, (x, y)


def _plain(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def test_ddp_optimizer_state_matches_dcp_format(world_of_one):
    model, opt, _ = _trained("ddp", world_of_one)
    ours = full_optimizer_state(model, opt, "ddp")
    ref = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    assert ours["param_groups"] == ref["param_groups"]
    assert ours["state"].keys() == ref["state"].keys()
    for name, s in ref["state"].items():
        for k, v in s.items():
            torch.testing.assert_close(ours["state"][name][k], v)
    assert list(full_model_state(model, "ddp")) == ["net.1.weight", "net.1.bias", "net.3.weight",
                                                    "net.3.bias"]


def test_ddp_and_fsdp_resume_from_each_other(world_of_one):
    for src, dst in (("ddp", "fsdp"), ("fsdp", "ddp")):
        model, opt, (x, y) = _trained(src, world_of_one)
        # a checkpoint holds copies, never the live tensors
        msd = copy_to_cpu(full_model_state(model, src))
        osd = copy_to_cpu(full_optimizer_state(model, opt, src))
        other, other_opt, _ = _trained(dst, world_of_one, seed=1)
        load_full_state(other, other_opt, msd, osd, dst)
        for m, o in ((model, opt), (other, other_opt)):
            nn.functional.cross_entropy(m(x), y).backward()
            o.step()
        a, b = full_model_state(model, src), full_model_state(other, dst)
        for k in a:
            torch.testing.assert_close(_plain(a[k]), _plain(b[k]), msg=f"{src}->{dst} {k}")
