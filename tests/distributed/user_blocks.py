"""A team's own model for the FSDP tests: a small residual network of its own block class
(``TeamBlock``: nothing the platform knows), built by import path like any user factory."""

from torch import nn


class TeamBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TeamNet(nn.Module):
    def __init__(self, features: int, num_classes: int, width: int, blocks: int):
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.ModuleList(TeamBlock(width) for _ in range(blocks))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.stem(x.flatten(1))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def team_net(input_shape, num_classes, width: int = 32, blocks: int = 3):
    return TeamNet(input_shape[0], num_classes, width, blocks)
