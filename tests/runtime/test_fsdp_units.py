"""FSDP units of a user's own model: named by class, or found by size; activation checkpointing
per unit; parameter names (and so checkpoints) unchanged by either."""

import pytest
import torch
from torch import nn

from training_runtime.distributed.fsdp import wrap_model
from training_runtime.distributed.units import fsdp_units, parse_unit_names
from training_runtime.models.builtin import TransformerBlock, build_model


class UserBlock(nn.Module):  # a block class the platform does not know
    def __init__(self, d: int):
        super().__init__()
        self.attn = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.mlp(x + self.attn(x))


class UserLM(nn.Module):
    def __init__(self, d: int = 256, layers: int = 12, vocab: int = 512, tied: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(UserBlock(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def test_the_size_policy_finds_a_user_models_blocks_and_leaves_tied_weights_to_the_root():
    model = UserLM()
    units = fsdp_units(model)
    assert units == list(model.layers)  # each block (1/12 of the layers' weights) is a unit, in order
    assert all(model.embed.weight is not p for m in units for p in m.parameters())


def test_a_larger_unit_size_takes_blocks_whole_and_a_smaller_one_splits_them():
    model = UserLM(tied=False)
    block = sum(p.numel() for p in model.layers[0].parameters())
    assert fsdp_units(model, max_params=block) == list(model.layers)
    parts = fsdp_units(model, max_params=block // 2)  # the MLP is larger than that: its Linears are units
    assert model.layers[0].mlp[0] in parts and model.layers[0].mlp not in parts and model.layers[0] not in parts
    assert model.layers[0].attn not in parts  # under a quarter of the size: it stays with the root
    assert not any(isinstance(m, nn.ModuleList) for m in parts)


def test_small_models_and_the_platforms_own_models_keep_their_units():
    assert fsdp_units(UserLM(d=16, layers=2)) == []  # below 2**20 parameters: one unit, the root
    lm = build_model("transformer_lm", [16], 32, d_model=32, nhead=2, num_layers=2)
    assert [type(m) for m in fsdp_units(lm)] == [TransformerBlock] * 2
    assert fsdp_units(build_model("mlp", [8], 3, hidden_sizes=[2048, 2048])) == []


def test_units_named_by_class():
    model = UserLM()
    assert parse_unit_names(" UserBlock, ") == ("UserBlock",)
    assert fsdp_units(model, ["UserBlock"]) == list(model.layers)
    nested = fsdp_units(model, [f"{__name__}.UserBlock", "Sequential"])
    assert nested.index(model.layers[0].mlp) < nested.index(model.layers[0])  # inner units first
    with pytest.raises(ValueError, match=r"names \['GPT2Block'\].*module classes are \[.*'UserBlock'"):
        fsdp_units(model, ["GPT2Block"])
    with pytest.raises(ValueError, match="Embedding shares parameters"):
        fsdp_units(model, ["Embedding"])


@pytest.mark.parametrize("sharding", ["fsdp", "ddp"])
def test_a_user_model_trains_with_units_and_activation_checkpointing(world_of_one, sharding):
    torch.manual_seed(0)
    reference = UserLM(d=64, layers=4, vocab=64)
    names = [n for n, _ in reference.named_parameters()]
    model = wrap_model(UserLM(d=64, layers=4, vocab=64), sharding, world_of_one, units=["UserBlock"],
                       activation_checkpointing=True)
    assert [n.removeprefix("module.") for n, _ in model.named_parameters()] == names
    tokens = torch.randint(0, 64, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(tokens).reshape(-1, 64), ((tokens + 1) % 64).reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_activation_checkpointing_without_units_is_refused(world_of_one):
    with pytest.raises(ValueError, match="no units besides the root: name its blocks in train.fsdp_units"):
        wrap_model(build_model("mlp", [8], 3, hidden_sizes=[16]), "ddp", world_of_one, activation_checkpointing=True)
