"""TensorBoard event files: the reporter's tags and steps read back with TensorBoard's own loader,
a resumed attempt's purge, and a real torchrun run that is killed and resumed."""

import json
import math
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto.event_pb2 import SessionLog

from tests.runtime.helpers import make_config, make_dataset, torchrun
from training_runtime.observe.tensorboard import TensorBoardReporter, event_dir, telemetry_scalars


class RecordingReporter:
    def __init__(self):
        self.messages, self.payloads = [], []

    def info(self, message):
        self.messages.append(message)

    def custom(self, payload):
        self.payloads.append(payload)


def load(logdir: Path) -> EventAccumulator:
    # size_guidance 0: keep every point (the default samples scalars down to 10,000).
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def session_starts(event_file: Path) -> list[int]:
    """Steps of the SessionLog START events in one event file (SummaryWriter's purge_step)."""
    return [e.step for e in EventFileLoader(str(event_file)).Load()
            if e.HasField("session_log") and e.session_log.status == SessionLog.START]


def points(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def telemetry(step: int, loss: float, **extra) -> dict:
    return {"kind": "telemetry", "step": step, "epoch": 1, "loss": loss, "lr": 0.01 / step,
            "samples_per_second": 100.0 * step, "data_wait_share": 0.25,
            "per_rank_step_time_s": [0.1, 0.3], "per_rank_data_wait_share": [0.2, 0.4],
            "cpu_percent": 50.0, "rss_bytes": 2**30, **extra}


def test_figures_become_grouped_scalars_detections_text_and_everything_reaches_the_inner_reporter(tmp_path):
    inner = RecordingReporter()
    payloads = [
        telemetry(2, 1.5, grad_norm=3.0, gpu_utilization_percent=87.0, gpu_name="H200",
                  gpu_throttle_reasons=["sw_power_cap"], gpu_time_upto_step=0,
                  per_rank_gpu_step_time_s=[0.05, 0.07]),
        {"kind": "validation", "step": 2, "validation_accuracy": 0.5, "validation_loss": 1.25,
         "best_step": 2, "monitor": "loss"},
        telemetry(4, 0.75, grad_norm=2.0, gpu_utilization_percent=91.0),
        {"kind": "detection", "detector": "straggler", "severity": "warning", "step": 4, "rank": 1,
         "message": "rank 1 is 3.0x slower than the median"},
        {"kind": "final", "final_loss": 0.75, "steps": 4},
    ]
    with TensorBoardReporter(inner, tmp_path / "tb") as reporter:
        reporter.info("hello")
        for p in payloads:
            reporter.custom(p)
    assert inner.messages == ["hello"] and inner.payloads == payloads

    acc = load(tmp_path / "tb")
    assert points(acc, "train/loss") == [(2, 1.5), (4, 0.75)]
    assert points(acc, "train/grad_norm") == [(2, 3.0), (4, 2.0)]
    assert [s for s, _ in points(acc, "train/lr")] == [2, 4]
    assert points(acc, "train/samples_per_second") == [(2, 200.0), (4, 400.0)]
    assert points(acc, "train/data_wait_share") == [(2, 0.25), (4, 0.25)]
    assert points(acc, "system/gpu_utilization_percent") == [(2, 87.0), (4, 91.0)]
    assert points(acc, "system/rss_bytes") == [(2, 2.0**30), (4, 2.0**30)]
    assert [v for _, v in points(acc, "per_rank/step_time_s/rank1")] == pytest.approx([0.3, 0.3])
    assert [v for _, v in points(acc, "per_rank/gpu_step_time_s/rank0")] == pytest.approx([0.05])
    assert points(acc, "validation/accuracy") == [(2, 0.5)] and points(acc, "validation/loss") == [(2, 1.25)]
    tags = set(acc.Tags()["scalars"])
    # Names, positions and strings are not figures; the final payload repeats what the curves hold.
    assert not {t for t in tags if "gpu_name" in t or "throttle" in t or "upto" in t or t.endswith("/step")}
    assert not {t for t in tags if t.startswith("final") or "best_step" in t}
    text = acc.Tensors("detections/straggler/text_summary")
    assert [e.step for e in text] == [4]
    assert b"rank 1 is 3.0x slower" in text[0].tensor_proto.string_val[0]


def test_a_resumed_attempt_hides_the_points_a_killed_attempt_wrote_after_its_checkpoint(tmp_path):
    logdir = tmp_path / "tb"
    with TensorBoardReporter(RecordingReporter(), logdir) as first:
        for step in (2, 4, 6, 8):
            first.custom(telemetry(step, loss=float(step)))
    # Killed after step 8; the newest checkpoint was step 4: the next attempt redoes 5..8. TensorBoard
    # reads a directory's files in name order, whose first field is the creation second: a real
    # restart starts seconds later, and so does this one.
    time.sleep(1.1)
    with TensorBoardReporter(RecordingReporter(), logdir, resumed_from_step=lambda: 4) as resumed:
        for step in (6, 8, 10):
            resumed.custom(telemetry(step, loss=step / 8))
    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert len(files) == 2
    assert points(load(logdir), "train/loss") == [(2, 2.0), (4, 4.0), (6, 0.75), (8, 1.0), (10, 1.25)]
    # What hides them: each attempt's file starts with a restart marker at one past its checkpoint
    # (TensorBoard drops every earlier point at or after that step, whatever its tag).
    assert [session_starts(f) for f in files] == [[0], [5]]


def test_the_writer_opens_only_when_there_is_a_figure_and_asks_for_the_resume_step_then(tmp_path):
    asked = []
    reporter = TensorBoardReporter(RecordingReporter(), tmp_path / "tb",
                                   resumed_from_step=lambda: asked.append(True))
    reporter.info("starting")
    reporter.custom({"kind": "final", "final_loss": 1.0})
    assert not (tmp_path / "tb").exists() and not asked
    reporter.custom(telemetry(2, 1.0))
    reporter.close()
    reporter.custom(telemetry(4, 1.0))  # after close: forwarded, not written
    assert asked == [True] and points(load(tmp_path / "tb"), "train/loss") == [(2, 1.0)]


def test_telemetry_keys_map_to_tags_by_what_they_measure():
    scalars = telemetry_scalars({"kind": "telemetry", "step": 7, "loss": math.inf, "stopped": True,
                                 "gpu_memory_used_bytes": 5, "per_rank_step_time_s": [0.1, "n/a"],
                                 "my_metric": 2})
    assert scalars == {"train/loss": math.inf, "system/gpu_memory_used_bytes": 5.0,
                       "per_rank/step_time_s/rank0": 0.1, "train/my_metric": 2.0}


def test_the_event_dir_is_beside_the_checkpoint_dir():
    assert event_dir("/runs/digits/abc/checkpoints/") == Path("/runs/digits/abc/tensorboard")


@pytest.mark.slow
def test_a_killed_and_resumed_torchrun_run_leaves_one_curve_beside_its_checkpoints(tmp_path):
    manifest, locations = make_dataset(tmp_path)
    cfg = make_config(tmp_path, manifest, locations, name="tb")  # 24 steps, checkpoints every 4
    proc = torchrun(cfg, tmp_path / "tb.json", max_restarts=1,
                    env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": "1:10"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 8 and metrics["restart_count"] == 1

    logdir = Path(cfg["checkpoint"]["dir"]).parent / "tensorboard"
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2  # one file per attempt
    acc = load(logdir)
    history = dict(metrics["loss_history"])
    loss = points(acc, "train/loss")
    assert [s for s, _ in loss] == list(range(2, 25, 2))  # telemetry.every_steps 2, each step once
    assert [v for _, v in loss] == pytest.approx([history[s] for s, _ in loss], rel=1e-6)
    assert [s for s, _ in points(acc, "per_rank/step_time_s/rank1")] == list(range(2, 25, 2))
    assert [s for s, _ in points(acc, "validation/accuracy")] == [12, 24]  # each epoch's end
