"""The relay team's code location: a table of its own whose column ``key`` names each row (0..N-1),
and a model trained by the team's own function (relay/train.py), which records the samples each
rank trains on. It imports only ``pipelines.api``."""

import numpy as np
import pandas as pd

from pipelines.api import model_pipeline, team_definitions

N = 240
FEATURES = ("key", "a", "b", "c")


def load_rows() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 3))
    return pd.DataFrame({"row_id": [f"row-{i:03d}" for i in range(N)], "key": np.arange(N, dtype=float),
                         "a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": (x[:, 0] + x[:, 1] > 0).astype(int)})


relay = model_pipeline(
    "relay", source=load_rows, features=FEATURES, label="label", classes=range(2), id_column="row_id",
    model="mlp", model_kwargs={"hidden_sizes": [16]}, train="relay.train:fit",
    recipe={"epochs": 8, "batch_size": 16, "lr": 0.05, "world_size": 1, "checkpoint_every_steps": 4,
            "max_restarts": 3},
    split={"seed": 0, "samples_per_shard": 32},
    description="A small classifier trained by the relay team's own loop, which records its samples.")

defs = team_definitions("relay", [relay])
