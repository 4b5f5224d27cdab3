"""The training op copies the run's TensorBoard event files beside its weights in the artifact
store; the version's lineage record names where, and housekeeping judges them with the weights."""

from pathlib import Path

import pytest

from core.housekeeping import CHECKPOINT_KEY
from core.lineage import build_lineage_record, lineage_rows
from ops.tensorboard_events import run_event_dir, upload_event_files
from resources.artifacts.local import LocalArtifactStore
from tests.cli.tensorboard_versions import write_run_events

FOLDER = "models/digits/checkpoints/run-7/"


def test_the_event_files_go_beside_the_weights_and_nothing_else_of_the_folder(tmp_path):
    checkpoints = write_run_events(tmp_path / "work", [1.0, 0.5])
    (checkpoints.parent / "tensorboard" / "notes.txt").write_text("not an event file")
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    events = upload_event_files(artifacts, {"checkpoint": {"dir": str(checkpoints)}}, FOLDER)
    local = sorted(p.name for p in (checkpoints.parent / "tensorboard").glob("events.out.tfevents.*"))
    assert len(local) == 1
    assert artifacts.list_keys(FOLDER) == [f"{FOLDER}tensorboard/{local[0]}"]
    assert events == {"tensorboard_path": f"{FOLDER}tensorboard/",
                      "tensorboard_uri": (tmp_path / "artifacts" / FOLDER / "tensorboard").as_uri()}
    # Housekeeping reads the run id out of the key: the events live and die with the weights.
    match = CHECKPOINT_KEY.match(artifacts.list_keys(FOLDER)[0])
    assert match is not None and match["run_id"] == "run-7"


def test_every_attempt_of_a_restarted_run_is_copied(tmp_path):
    checkpoints = write_run_events(tmp_path / "work", [1.0, 0.5])
    write_run_events(tmp_path / "work", [0.4])  # a second attempt appends a file of its own
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    upload_event_files(artifacts, {"checkpoint": {"dir": str(checkpoints)}}, FOLDER)
    assert len(artifacts.list_keys(FOLDER + "tensorboard/")) == 2


def test_a_run_that_wrote_no_event_files_adds_nothing(tmp_path):
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    assert upload_event_files(artifacts, {"checkpoint": {"dir": str(tmp_path / "work" / "checkpoints")}}, FOLDER) == {}
    assert artifacts.list_keys() == []


def test_a_config_without_a_checkpoint_dir_says_what_is_missing():
    with pytest.raises(ValueError, match="no checkpoint.dir"):
        run_event_dir({"output_dir": "/x"})
    assert run_event_dir({"checkpoint": {"dir": "/w/run/checkpoints"}}) == Path("/w/run/tensorboard")


def test_the_lineage_record_names_the_event_files_and_shows_them_as_a_row():
    def record(**events: str) -> dict:
        checkpoint = {"weights_uri": "s3://b/w", "weights_sha256": "0" * 64, "weights_path": FOLDER + "model.safetensors",
                      "commit_id": "c", **events}
        return build_lineage_record(
            model="digits", version=1, checkpoint=checkpoint, raw={"commit_id": "r"},
            shards={"dataset": "digits", "commit_id": "s", "manifest_path": "m.json"}, store_facts={},
            resolved_config={"world_size": 2, "backend": "gloo"}, metrics={}, evaluation={"test": {}},
            gate={"passed": True}, run_id="r1", run_url="http://dagster/runs/r1")

    uri = "s3://b/artifacts/" + FOLDER + "tensorboard"
    named = record(tensorboard_path=FOLDER + "tensorboard/", tensorboard_uri=uri)
    assert named["checkpoint"]["tensorboard_path"] == FOLDER + "tensorboard/"
    assert named["checkpoint"]["tensorboard_uri"] == uri
    assert {r.field: r.value for r in lineage_rows(named)}["tensorboard"] == uri
    older = record()  # a checkpoint from before event files: no row, the fields say None
    assert older["checkpoint"]["tensorboard_path"] is None
    assert "tensorboard" not in {r.field for r in lineage_rows(older)}
