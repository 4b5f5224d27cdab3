"""A training's event files reach the artifact store while it trains, and the run links to its
TensorBoard view from the first interval on: the copy (only what changed, from a snapshot), the
run filter and link TensorBoard opens on, the logdir it serves, and the op-side watcher in a real
Dagster run whose "training" writes events as rank 0 does."""

import json
import logging
import re
import threading
import time
import urllib.parse
from pathlib import Path

import dagster as dg
import pytest

from ops.live_tensorboard import LINK_KEY, LiveTensorBoard
from ops.tensorboard_events import EventFileSync, run_filter, tensorboard_link, tensorboard_logdir
from pipelines.profiles import TENSORBOARD_URL_ENV, served_tensorboard_url
from resources.artifacts.local import LocalArtifactStore
from resources.artifacts.s3 import S3ArtifactStore
from tests.cli.tensorboard_versions import _Quiet
from training_runtime.observe.tensorboard import TensorBoardReporter

RUN = "0b6f1e52-9d7c-4d1e-8a39-5c2f7f0e1a10"
FOLDER = f"models/digits/checkpoints/{RUN}/"
CHECKPOINT = dg.AssetKey(["digits", "checkpoint"])


def _telemetry(reporter: TensorBoardReporter, step: int, loss: float) -> None:
    reporter.custom({"kind": "telemetry", "step": step, "loss": loss, "lr": 0.01})


def test_a_sync_copies_what_changed_and_nothing_else(tmp_path):
    events = tmp_path / "work" / "tensorboard"
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    # No bandwidth bound here: it has a test of its own, with a clock of its own.
    sync = EventFileSync(artifacts, events, FOLDER + "tensorboard", bytes_per_s=float("inf"))
    assert sync.sync() == 0  # nothing written yet: not even the folder exists
    (events.parent).mkdir(parents=True)
    with TensorBoardReporter(_Quiet(), events) as reporter:
        _telemetry(reporter, 10, 1.0)
        assert sync.sync() == 1
        (key,) = artifacts.list_keys(FOLDER)
        first = (tmp_path / "artifacts" / key).read_bytes()
        assert sync.sync() == 0  # unchanged since: no upload
        _telemetry(reporter, 20, 0.5)
        assert sync.sync() == 1
        grown = (tmp_path / "artifacts" / key).read_bytes()
    assert len(grown) > len(first) and grown.startswith(first)  # the same file, appended to
    (events / "notes.txt").write_text("not an event file")
    sync.sync()
    assert artifacts.list_keys(FOLDER) == [key]


def test_a_large_file_is_copied_again_only_as_often_as_its_size_allows(tmp_path):
    events = tmp_path / "tensorboard"
    events.mkdir()
    grown = events / "events.out.tfevents.1.host"
    grown.write_bytes(b"x" * 1000)
    now = [0.0]
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    sync = EventFileSync(artifacts, events, FOLDER + "tensorboard", bytes_per_s=100.0, clock=lambda: now[0])
    assert sync.sync() == 1
    with grown.open("ab") as f:
        f.write(b"y" * 10)
    now[0] = 9.0
    assert sync.sync() == 0  # 1000 bytes at 100 bytes/s: not before 10 s
    now[0] = 10.0
    assert sync.sync() == 1
    with grown.open("ab") as f:
        f.write(b"z")
    assert sync.sync() == 0 and sync.sync(final=True) == 1  # the training's end copies at once
    assert (tmp_path / "artifacts" / FOLDER / "tensorboard" / grown.name).read_bytes() == grown.read_bytes()


def test_the_run_filter_selects_the_runs_folder_and_its_trials_only():
    pattern = run_filter(FOLDER)
    assert pattern == f"^digits/checkpoints/{RUN}/"
    # TensorBoard's run names are the event folders relative to its logdir (models/).
    names = {f"digits/checkpoints/{RUN}/tensorboard": True,
             f"digits/checkpoints/{RUN}/trials/trial-001/tensorboard": True,
             f"digits/checkpoints/{RUN}-retry/tensorboard": False,
             f"digits_wide/checkpoints/{RUN}/tensorboard": False,
             "digits/checkpoints/other/tensorboard": False}
    assert {name: bool(re.search(pattern, name)) for name in names} == names
    # Characters a regular expression reads as operators are escaped.
    assert run_filter("models/a.b/checkpoints/r+1/") == r"^a\.b/checkpoints/r\+1/"
    with pytest.raises(ValueError, match="not under models/"):
        run_filter("sources/digits/")


def test_the_link_opens_the_time_series_filtered_to_the_run():
    link = tensorboard_link("https://dagster.example.com/tensorboard/", FOLDER)
    parsed = urllib.parse.urlsplit(link)
    assert (parsed.scheme, parsed.netloc, parsed.path, parsed.fragment) == (
        "https", "dagster.example.com", "/tensorboard/", "timeseries")
    query = urllib.parse.parse_qs(parsed.query)
    assert query["runFilter"] == [run_filter(FOLDER)]
    assert json.loads(query["pinnedCards"][0]) == [{"plugin": "scalars", "tag": "train/loss"}]  # the loss on top


def test_tensorboard_serves_the_stores_models_area(tmp_path):
    assert tensorboard_logdir(LocalArtifactStore(tmp_path / "my artifacts")) == str(tmp_path / "my artifacts" / "models")
    s3 = S3ArtifactStore("model-factory-artifacts", prefix="artifacts", endpoint_url="http://127.0.0.1:1")
    assert tensorboard_logdir(s3) == "s3://model-factory-artifacts/artifacts/models"


def test_the_tensorboard_url_comes_from_the_environment_or_is_absent():
    assert served_tensorboard_url({}) is None and served_tensorboard_url({TENSORBOARD_URL_ENV: " "}) is None
    assert served_tensorboard_url({TENSORBOARD_URL_ENV: "http://127.0.0.1:6007/"}) == "http://127.0.0.1:6007"
    with pytest.raises(ValueError, match=f"{TENSORBOARD_URL_ENV}='127.0.0.1:6006' is not an http"):
        served_tensorboard_url({TENSORBOARD_URL_ENV: "127.0.0.1:6006"})


def _write_like_rank0(work_dir: Path, steps: int, started: threading.Event, gap_s: float) -> None:
    with TensorBoardReporter(_Quiet(), work_dir / "tensorboard") as reporter:
        for i in range(1, steps + 1):
            _telemetry(reporter, 10 * i, 1.0 / i)
            started.set()
            time.sleep(gap_s)


def _observations(instance, run_id) -> list[dg.AssetObservation]:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    return [r.event_log_entry.dagster_event.asset_observation_data.asset_observation for r in records]


@pytest.mark.parametrize("url", ["http://127.0.0.1:6006", None], ids=["with-tensorboard", "without"])
def test_the_run_links_its_view_from_the_first_interval_while_it_trains(tmp_path, url):
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    run_dir = tmp_path / "checkpoints" / "digits" / RUN
    seen_during: dict = {}

    @dg.asset(key=CHECKPOINT)
    def checkpoint(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        folder = f"models/digits/checkpoints/{context.run_id}/"
        live = LiveTensorBoard(context, artifacts, folder=folder, run_dir=run_dir, tensorboard_url=url,
                               interval_s=0.05)
        started = threading.Event()
        trainer = threading.Thread(target=_write_like_rank0, args=(run_dir, 6, started, 0.1))
        with live.watching(run_dir):
            trainer.start()
            started.wait(10)
            deadline = time.monotonic() + 10
            while not artifacts.list_keys(folder) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # a few intervals: the announcement follows the first copy
            seen_during["observations"] = _observations(context.instance, context.run_id)
            seen_during["training"] = trainer.is_alive()
            trainer.join()
        return dg.MaterializeResult(metadata=live.metadata())

    with dg.instance_for_test() as instance:
        result = dg.materialize([checkpoint], instance=instance)
        logs = [r.event_log_entry.user_message for r in instance.get_records_for_run(result.run_id).records
                if r.event_log_entry.dagster_event is None]
    folder = f"models/digits/checkpoints/{result.run_id}/"
    (key,) = artifacts.list_keys(folder)
    assert key.startswith(folder + "tensorboard/events.out.tfevents.")
    assert seen_during["training"], "the check ran after the training had ended; make the training longer"
    (materialization,) = result.get_asset_materialization_events()
    meta = materialization.materialization.metadata
    if url is None:
        assert seen_during["observations"] == [] and LINK_KEY not in meta
        (line,) = [m for m in logs if "TensorBoard event files are copied" in m]
        assert artifacts.uri(folder + "tensorboard") in line and "TENSORBOARD_URL" in line
        return
    link = tensorboard_link(url, folder)
    # While the training still ran: one observation of the checkpoint, the link as a url value.
    (observation,) = seen_during["observations"]
    assert observation.asset_key == CHECKPOINT
    assert observation.metadata[LINK_KEY] == dg.MetadataValue.url(link)
    assert [m for m in logs if m.startswith("TensorBoard of this run")] == [
        f"TensorBoard of this run, live while it trains: {link}"]
    assert meta[LINK_KEY] == dg.MetadataValue.url(link)


def test_a_failing_copy_is_reported_once_and_the_training_goes_on(tmp_path):
    class Refusing(LocalArtifactStore):
        def put_file(self, local_path, key):
            raise OSError("disk full")

    run_dir = tmp_path / "run"

    @dg.asset(key=CHECKPOINT)
    def checkpoint(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        live = LiveTensorBoard(context, Refusing(tmp_path / "artifacts"), folder=FOLDER, run_dir=run_dir,
                               tensorboard_url="http://127.0.0.1:6006", interval_s=0.02)
        with live.watching(run_dir):
            _write_like_rank0(run_dir, 3, threading.Event(), 0.05)
        return dg.MaterializeResult(metadata=live.metadata())

    with dg.instance_for_test() as instance:
        result = dg.materialize([checkpoint], instance=instance)
        logs = [r.event_log_entry for r in instance.get_records_for_run(result.run_id).records
                if r.event_log_entry.dagster_event is None]
    (warning,) = [e for e in logs if "could not copy" in e.user_message]  # once, not at every interval
    assert warning.level == logging.WARNING and "OSError: disk full" in warning.user_message
    assert LINK_KEY not in result.get_asset_materialization_events()[0].materialization.metadata
