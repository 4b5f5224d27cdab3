"""A team's image folder in parts, for a code location outside the repository, as a user runs it on
an empty DAGSTER_HOME: the lens team's package (written to a temporary folder, which nothing in
the repository can import) declares an image classifier on a folder in the store's sources area,
its parts ingested two to a Dagster step. ``python -m pipelines sources add`` commits the folder
and ``python -m pipelines train`` makes version 1; then a few images are added to the folder,
committed the same way, and trained again. Version 2's raw ingest decoded only the parts the new
images fall in, in steps of their own; its raw copy keeps version 1's other parts as they are
(the same files, not written again), and what the run recorded says so."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.kinds.image_parts import INDEX_NAME
from core.datasets import dataset_tags
from core.registry import list_versions, read_lineage
from pipelines.models.shapes import CLASSES, draw_shape, write_shapes_source
from tests.teams.team_cli import team_location

pytestmark = pytest.mark.slow

NAME = "lens_shapes"
FOLDER = "lens/shapes"
DEFINITIONS = textwrap.dedent(f'''
    from pipelines.api import ImageFolder, ImagePreprocessing, model_pipeline, team_definitions

    shapes = model_pipeline(
        "{NAME}", source=ImageFolder(root="{FOLDER}", files_per_part=8, parts_per_step=2, files_per_chunk=4),
        classes=("circle", "square", "triangle"), preprocessing=ImagePreprocessing(size=(32, 32)),
        model="resnet", model_kwargs={{"widths": [8, 16], "stem_stride": 2}},
        recipe={{"epochs": 1, "batch_size": 16, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 1000}},
        gate={{"test_accuracy": {{"min": 0.0}}}}, split={{"seed": 0, "samples_per_shard": 16}}, team="lens")

    defs = team_definitions("lens", [shapes])
''')
RAW = f"datasets/{NAME}/raw/"


def runs_of(home: Path) -> list[dict]:
    """Each run of the instance, oldest first: its ingest steps that succeeded, and the raw asset's
    materialization metadata."""
    out = []
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = sorted(instance.get_runs(), key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp)
        for run in runs:
            steps = [e.step_key for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
                     if "_ingest_parts[" in e.step_key]
            raw = [e.asset_materialization for e in instance.all_logs(
                run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
                if e.asset_materialization.asset_key == dg.AssetKey([NAME, "raw_dataset"])]
            logs = [e.user_message for e in instance.all_logs(run.run_id) if "part(s) changed" in e.user_message]
            out.append({"steps": steps, "raw": {k: v.value for k, v in raw[0].metadata.items()} if raw else None,
                        "parts_line": logs})
    return out


def test_a_team_image_folder_is_ingested_over_steps_and_grows_by_its_new_parts(tmp_path):
    team = team_location(tmp_path, "lens", DEFINITIONS)
    cli = team.cli
    folder = write_shapes_source(tmp_path / "local", per_class=16, seed=4)  # 48 images, about 6 parts

    cli("sources", "add", NAME, str(folder))
    assert f"{NAME} v1" in cli("train", NAME)
    rng = np.random.default_rng(11)
    for i, kind in enumerate(CLASSES):  # 3 more images, named after the others of their class
        draw_shape(kind, rng).save(folder / kind / f"{kind}-9{i:03d}.jpg", "JPEG", quality=90)
    cli("sources", "add", NAME, str(folder))
    assert f"{NAME} v2" in cli("train", NAME)

    store = team.store()
    assert list_versions(store, NAME) == [1, 2]
    tags = dataset_tags(store, NAME)
    before, after = (json.loads(store.get_object(tags[v], RAW + INDEX_NAME))["parts"] for v in (1, 2))
    kept = {p["key"] for p in before} & {p["key"] for p in after}
    new = [p for p in after if p["key"] not in kept]
    assert len(before) >= 5 and 1 <= len(new) <= 3 and len(kept) >= len(before) - 2
    assert sum(p["rows"] for p in after) == 51

    # version 1 was ingested over several steps, two parts each; version 2 only its new parts
    first, second = (r for r in runs_of(team.home) if r["raw"] is not None)
    assert len(first["steps"]) == -(-len(before) // 2) >= 3
    assert len(second["steps"]) == -(-len(new) // 2)
    assert (first["raw"]["parts_made"], first["raw"]["parts_reused"]) == (len(before), 0)
    assert (second["raw"]["parts_made"], second["raw"]["parts_reused"]) == (len(new), len(kept))
    assert second["parts_line"] and f"{len(kept)} part(s)" in second["parts_line"][0], second["parts_line"]

    # the kept parts' files are version 1's, untouched by version 2's commit
    files = {p["key"]: {RAW + p["raw"], RAW + p["rows_table"]} for p in after}
    changed = {d.path for d in store.diff(tags[1], tags[2], prefix=RAW)}
    assert not changed & set().union(*(files[k] for k in kept))
    assert set().union(*(files[p["key"]] for p in new)) <= changed
    for key in kept:
        for path in files[key]:
            assert store.stat_object(tags[2], path) == store.stat_object(tags[1], path)

    # and version 2 trained on that commit
    assert read_lineage(store, NAME, 2)["data"]["dataset_version"] == f"{NAME}-d2"
