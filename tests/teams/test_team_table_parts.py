"""A team's table dataset in parts, for a code location outside the repository, as a user runs it
on an empty DAGSTER_HOME: the abacus team's package (written to a temporary folder, which nothing
in the repository can import) declares a model on a CSV in the store's sources area. ``python -m
pipelines sources add`` commits the CSV and ``python -m pipelines train`` makes version 1; then
1 % more rows are appended to the CSV, committed the same way, and trained again. The second
dataset version's commit adds and removes the shard files of the parts the new rows fall in and
no others, and the training reads the grown table normalised on read: its features are stored in
the source's units (thousands around 5,000), which the model learns only once they are normalised."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from core.datasets import dataset_tags
from core.registry import list_versions, read_lineage
from training_runtime.data.shard_format import NORMALISE_ON_READ
from training_runtime.data.split import open_split
from tests.teams.team_cli import team_location

pytestmark = pytest.mark.slow

NAME = "abacus_ledger"
DEFINITIONS = textwrap.dedent(f'''
    from pipelines.api import model_pipeline, team_definitions

    ledger = model_pipeline(
        "{NAME}", source="abacus/ledger.csv", features=["a", "b", "c"], label="label", classes=range(3),
        id_column="row_id", model="mlp", model_kwargs={{"hidden_sizes": [16]}},
        recipe={{"epochs": 8, "batch_size": 32, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 1000}},
        gate={{"min_test_accuracy": 0.7}}, split={{"seed": 0, "samples_per_shard": 32}}, team="abacus")

    defs = team_definitions("abacus", [ledger])
''')


def rows(start: int, stop: int) -> pd.DataFrame:
    """Rows ``start``..``stop`` (each drawn from its own seed, so a row is the same in every file):
    the label is which third of ``a``'s range a row is in."""
    draws = np.stack([np.random.default_rng(i).normal(size=3) for i in range(start, stop)])
    return pd.DataFrame({"row_id": [f"row-{i:05d}" for i in range(start, stop)],
                         "a": draws[:, 0] * 1000 + 5000, "b": draws[:, 1] * 300 - 2000, "c": draws[:, 2],
                         "label": np.digitize(draws[:, 0], [-0.43, 0.43])})


def test_a_team_table_grows_by_its_new_parts_and_trains_normalised_on_read(tmp_path):
    team = team_location(tmp_path, "abacus", DEFINITIONS)
    home, cli = team.home, team.cli
    csv = tmp_path / "ledger.csv"


    rows(0, 600).to_csv(csv, index=False)
    cli("sources", "add", NAME, str(csv), "--to", "abacus/ledger.csv")
    assert f"{NAME} v1" in cli("train", NAME)
    rows(600, 606).to_csv(csv, mode="a", header=False, index=False)  # 1 % more rows, ids after the others
    cli("sources", "add", NAME, str(csv), "--to", "abacus/ledger.csv")
    assert f"{NAME} v2" in cli("train", NAME)

    store = team.store()
    assert list_versions(store, NAME) == [1, 2]
    tags = dataset_tags(store, NAME)
    assert sorted(tags) == [1, 2]
    prefix = f"datasets/{NAME}/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    new = {p["key"] for p in after["parts"]} - {p["key"] for p in before["parts"]}
    gone = {p["key"] for p in before["parts"]} - {p["key"] for p in after["parts"]}
    assert len(after["parts"]) >= 10 and 1 <= len(new) <= 3 and gone <= {before["parts"][-1]["key"]}

    def files(manifest: dict, keys: set[str]) -> set[str]:
        return {prefix + path for p in manifest["parts"] if p["key"] in keys for i in p["splits"].values()
                for path in i["shards"]}

    # the second version's commit: the new parts' shard files in, the replaced part's out, the manifest
    diff = {(d.path, d.type) for d in store.diff(tags[1], tags[2], prefix=prefix)}
    assert {path for path, _ in diff} == files(after, new) | files(before, gone) | {prefix + "manifest.json"}
    assert {path for path, kind in diff if kind == "added"} == files(after, new) - files(before, gone)

    # version 2 trained on that commit, its features in the source's units, normalised on read
    record = read_lineage(store, NAME, 2)
    assert record["data"]["dataset_version"] == f"{NAME}-d2"
    assert after[NORMALISE_ON_READ] and after["splits"]["train"]["num_samples"] > before["splits"]["train"]["num_samples"]
    paths = [store.download(tags[2], prefix + e["path"], tmp_path / "read" / e["path"])
             for e in after["splits"]["train"]["shards"]]
    train = open_split(after, paths, "train").gather(np.arange(after["splits"]["train"]["num_samples"]), ["features"])
    np.testing.assert_allclose(train["features"].mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(train["features"].std(axis=0), 1, rtol=1e-3)
    stored = np.fromfile(paths[0], dtype="<f4", count=3)  # the first sample as the shard holds it
    assert 1000 < stored[0] < 9000  # the source's units: ``a`` around 5,000
