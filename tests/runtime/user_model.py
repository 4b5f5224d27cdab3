"""A user model factory loaded by import path in the tests."""

from torch import nn


def tiny_linear(input_shape, num_classes, bias=True):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes, bias=bias))


def not_a_module(input_shape, num_classes):
    return "linear"


class NanAtStep(nn.Module):
    """A linear model whose training forward on rank ``rank`` returns NaN at its ``step``-th call
    (one call per optimizer step with grad_accum_steps 1): a bad batch, as a NaN in the data or an
    overflow would make it."""

    def __init__(self, input_shape, num_classes, step: int, rank: int):
        super().__init__()
        import os

        self.linear = nn.Linear(input_shape[0], num_classes)
        self.step, self.poisoned = step, int(os.environ.get("RANK", "0")) == rank
        self.calls = 0

    def forward(self, x):
        out = self.linear(x.flatten(1))
        if self.training:
            self.calls += 1
            if self.poisoned and self.calls == self.step:
                return out * float("nan")
        return out


def nan_at_step(input_shape, num_classes, step: int, rank: int):
    return NanAtStep(input_shape, num_classes, step, rank)
