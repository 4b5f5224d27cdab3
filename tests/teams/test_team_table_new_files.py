"""A team's table source that grows by a file a day, for a code location outside the repository,
as a user runs it on an empty DAGSTER_HOME: the abacus team's package (written to a temporary
folder, which nothing in the repository can import) declares a model on a folder of Parquet files
in the store's sources area, one file per day. ``python -m pipelines sources add`` commits six
days and ``python -m pipelines train`` makes version 1, its raw ingest spread over three steps of
two files (assets/table_ingest_steps.py); then the seventh day's file is committed
the same way and trained again. The raw asset reads the new file alone (its log says so), its
ingest record lists the seven files for the next day to build on, and the second dataset
version's commit adds and removes the shard files of the parts the new rows fall in and no others
(tests/pipeline/test_table_new_files.py proves such a version equal to a build from nothing)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.datasets import dataset_tags
from core.registry import list_versions, read_lineage
from tests.teams.team_cli import team_location

pytestmark = pytest.mark.slow

NAME = "abacus_events"
DEFINITIONS = textwrap.dedent(f'''
    from pipelines.api import Source, model_pipeline, team_definitions

    # two files a step: the first version's six days are ingested by three steps
    events = model_pipeline(
        "{NAME}", source=Source(paths=("abacus/events/*.parquet",), files_per_step=2), features=["a", "b", "c"], label="label", classes=range(3),
        id_column="row_id", model="mlp", model_kwargs={{"hidden_sizes": [16]}},
        recipe={{"epochs": 8, "batch_size": 32, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 1000}},
        gate={{"min_test_accuracy": 0.7}}, split={{"seed": 0, "samples_per_shard": 32}}, team="abacus")

    defs = team_definitions("abacus", [events])
''')


def day(n: int, rows: int = 100) -> pd.DataFrame:
    """Day ``n``'s events: ids after the previous days' (each row drawn from its own seed); the
    label is which third of ``a``'s range a row is in."""
    ids = range(n * 1000, n * 1000 + rows)
    draws = np.stack([np.random.default_rng(i).normal(size=3) for i in ids])
    return pd.DataFrame({"row_id": [f"row-{i:05d}" for i in ids], "a": draws[:, 0], "b": draws[:, 1] * 3,
                         "c": draws[:, 2], "label": np.digitize(draws[:, 0], [-0.43, 0.43])})


def test_a_team_folder_of_daily_parquet_files_grows_by_the_new_file_alone(tmp_path):
    team = team_location(tmp_path, "abacus", DEFINITIONS)
    home, cli = team.home, team.cli
    export = tmp_path / "export"  # the team's daily export, a file a day
    export.mkdir()


    for n in range(1, 7):
        day(n).to_parquet(export / f"2026-12-0{n}.parquet", index=False)
    cli("sources", "add", NAME, *sorted(str(p) for p in export.iterdir()))
    assert f"{NAME} v1" in cli("train", NAME)
    day(7, rows=12).to_parquet(export / "2026-12-07.parquet", index=False)
    cli("sources", "add", NAME, str(export / "2026-12-07.parquet"))
    assert f"{NAME} v2" in cli("train", NAME)

    logs = raw_logs(home)
    assert any(f"{NAME}: appended to the published version's 600 row(s): 12 new row(s) of the new file(s) "
               "2026-12-07.parquet parsed and checked" in line for line in logs), logs
    assert sum(f"{NAME}: every row read (600): no published version to build on" in line for line in logs) == 1
    assert sum(f"{NAME}: 6 file(s) to ingest in 3 step(s) of up to 2 (every row read: no published version to "
               "build on)" in line for line in logs) == 1, logs

    store = team.store()
    assert list_versions(store, NAME) == [1, 2]
    tags = dataset_tags(store, NAME)
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

    # the raw copy's record, which the next day's file builds on
    record = json.loads(store.get_object(tags[2], f"datasets/{NAME}/raw/ingest.json"))
    assert [f["file"] for f in record["files"]] == [f"2026-12-0{n}.parquet" for n in range(1, 8)]
    assert record["rows"] == 612 and record["not_growable"] == "2026-12-07.parquet is not a CSV file Arrow read"
    assert read_lineage(store, NAME, 2)["data"]["dataset_version"] == f"{NAME}-d2"


def raw_logs(home: Path) -> list[str]:
    """The raw assets' log lines of every run on the instance at ``home``."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        return [e.message for run in instance.get_runs() for e in instance.all_logs(run.run_id)
                if (e.message or "").startswith(f"{NAME}: ")]
