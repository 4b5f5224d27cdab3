"""The guards' verdicts from given per-rank figures, and the watchdog on a fake clock."""

import math

import pytest

from training_runtime.observe import guards
from training_runtime.observe.guards import HangWatchdog, RankPlace

PLACES = [RankPlace("node-a", "cuda:0 H100"), RankPlace("node-b", "cuda:1 H100")]


def test_a_non_finite_loss_names_the_first_rank_whose_own_loss_went_bad():
    # Both ranks' gradients are non-finite from step 7 (after the exchange); only rank 1's loss was.
    d = guards.nonfinite_detection([2, 2], [7, 7], [0, 1], PLACES, skipped_before=0, skip_limit=0,
                                   checkpoint_dir="/ckpt")
    assert (d.severity, d.step, d.rank, d.host, d.gpu) == ("error", 7, 1, "node-b", "cuda:1 H100")
    assert "non-finite loss at step 7 on rank 1 (node-b, cuda:1 H100)" in d.message
    assert "/ckpt" in d.message and "nonfinite_skip_batches" in d.message


def test_skipping_is_a_warning_until_the_allowance_is_spent():
    first = guards.nonfinite_detection([1, 1], [3, 3], [1, 0], None, skipped_before=0, skip_limit=2, checkpoint_dir="/c")
    assert first.severity == "warning" and "batch skipped (1 of at most 2)" in first.message
    over = guards.nonfinite_detection([1, 1], [9, 9], [1, 0], None, skipped_before=2, skip_limit=2, checkpoint_dir="/c")
    assert over.severity == "error" and "after skipping 2 batch(es)" in over.message
    assert guards.nonfinite_detection([0, 0], [-1, -1], [0, 0], None, skipped_before=0, skip_limit=0,
                                      checkpoint_dir="/c") is None


def test_a_loss_spike_needs_history_and_a_multiple_of_the_median():
    assert guards.loss_spike_detection(10, 9.0, [1.0, 1.1], 3.0) is None  # too little history
    assert guards.loss_spike_detection(10, 2.9, [1.0, 1.0, 1.0], 3.0) is None
    d = guards.loss_spike_detection(10, 3.5, [1.0, 1.2, 0.9], 3.0)
    assert d.severity == "warning" and "3.5x the median 1" in d.message
    assert guards.loss_spike_detection(10, 100.0, [1.0] * 5, None) is None  # switched off


def test_a_straggler_must_be_slower_by_the_factor_and_by_enough_time():
    d = guards.straggler_detection(40, [0.010, 0.010, 0.030, 0.011], None, factor=1.5, min_excess_s=0.005)
    assert d.rank == 2 and "30.0 ms of compute per step" in d.message
    assert guards.straggler_detection(40, [0.0010, 0.0030], None, factor=1.5, min_excess_s=0.005) is None  # noise
    assert guards.straggler_detection(40, [0.020, 0.026], None, factor=1.5, min_excess_s=0.001) is None


def test_a_data_stall_names_the_rank_and_the_loader_settings():
    d = guards.data_stall_detection(12, [0.1, 0.6], PLACES, threshold=0.3, loader_threads=2, prefetch_batches=4,
                                    wait_per_step_s=[0.01, 0.06], min_wait_s=0.005)
    assert d.rank == 1 and "60%" in d.message and "loader_threads (now 2)" in d.message
    assert guards.data_stall_detection(12, [0.1, 0.2], PLACES, threshold=0.3, loader_threads=2,
                                       prefetch_batches=4, wait_per_step_s=[0.01, 0.02], min_wait_s=0.005) is None



def test_a_few_milliseconds_of_waiting_on_tiny_steps_is_no_data_stall():
    """A 10 ms CPU step that waited 4 ms (a thread scheduled late on a busy machine) is 40% of it,
    and no stall worth a warning; the same share of 100 ms steps is."""
    tiny = dict(threshold=0.3, loader_threads=2, prefetch_batches=4, min_wait_s=0.005)
    assert guards.data_stall_detection(12, [0.1, 0.4], PLACES, wait_per_step_s=[0.001, 0.004], **tiny) is None
    d = guards.data_stall_detection(12, [0.35, 0.4], PLACES, wait_per_step_s=[0.035, 0.004], **tiny)
    assert d.rank == 0 and "35%" in d.message  # the rank whose wait is a stall, not the larger share


def test_gpu_health_flags_heat_and_harmful_slowdowns_not_power_capping():
    found = guards.gpu_health_detections(5, [70.0, 91.0, 60.0], [["sw_power_cap"], [], ["hw_thermal_slowdown"]],
                                         None, max_temperature_c=85.0)
    assert [(d.rank, "91 C" in d.message, "hw_thermal_slowdown" in d.message) for d in found] == \
        [(1, True, False), (2, False, True)]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_watchdog_fires_only_after_a_step_and_not_while_paused():
    clock, exits = FakeClock(), []
    dog = HangWatchdog(10.0, rank=3, exit=exits.append, clock=clock)
    clock.now = 100.0
    assert dog.check() is None  # not armed before the first step (compilation, warm-up)
    dog.beat(1)
    clock.now = 105.0
    assert dog.check() is None
    with dog.paused():  # validation, checkpoint writes
        clock.now = 200.0
        assert dog.check() is None
    clock.now = 209.0
    assert dog.check() is None  # the pause's end counts as a beat
    clock.now = 211.0
    found = dog.check()
    assert found.detector == "hang" and found.rank == 3 and found.step == 1 and "11 s" in found.message


def test_no_timeout_means_no_watchdog():
    dog = HangWatchdog(None, rank=0)
    dog.start()
    dog.beat(1)
    assert dog.thread is None and dog.check() is None


@pytest.mark.parametrize("field,value,message", [
    ("hang_timeout_s", 900.0, "must be below train.collective_timeout_s"),
    ("data_stall_share", 1.5, "between 0 and 1"),
    ("data_stall_min_wait_s", -0.1, ">= 0"),
    ("straggler_factor", 0.5, "above 1"),
    ("nonfinite_skip_batches", -1, ">= 0"),
])
def test_bad_guard_settings_name_the_field(tmp_path, field, value, message):
    from tests.runtime.helpers import make_config, make_dataset
    from training_runtime.config import ConfigError, RunConfig

    manifest, locations = make_dataset(tmp_path)
    cfg = make_config(tmp_path, manifest, locations)
    cfg["guards"] = {field: value}
    with pytest.raises(ConfigError, match=f"guards.{field}.*{message}"):
        RunConfig.from_dict(cfg)


def test_the_lineage_lists_the_detections_and_summarises_them():
    from core.lineage import build_lineage_record, lineage_rows

    detections = [{"detector": "straggler", "severity": "warning", "step": 20, "rank": 1, "host": "b", "gpu": None,
                   "message": "rank 1 is a straggler"},
                  {"detector": "straggler", "severity": "warning", "step": 40, "rank": 1, "host": "b", "gpu": None,
                   "message": "rank 1 is a straggler"},
                  {"detector": "loss_spike", "severity": "warning", "step": 30, "rank": None, "host": None,
                   "gpu": None, "message": "loss spike"}]

    def record(metrics: dict) -> dict:
        return build_lineage_record(
            model="digits", version=1, checkpoint={"weights_uri": "s3://b/w", "weights_sha256": "0" * 64,
                                                   "weights_path": "models/d/w", "commit_id": "c"},
            raw={"commit_id": "r"}, shards={"dataset": "digits", "commit_id": "s", "manifest_path": "m.json"},
            store_facts={}, resolved_config={"world_size": 2, "backend": "gloo"}, metrics=metrics,
            evaluation={"test": {}}, gate={"passed": True}, run_id="r1", run_url="http://dagster/runs/r1")

    flagged = record({"detections": detections, "nonfinite_skipped": 0})
    assert flagged["training"]["detections"] == detections
    rows = {row.field: row.value for row in lineage_rows(flagged)}
    assert rows["training health"] == "3 detection(s): straggler x2 (rank 1), loss_spike x1"
    assert "training health" not in {row.field for row in lineage_rows(record({}))}  # a clean run shows none


def test_the_interval_loss_leaves_out_only_the_skipped_steps():
    # rank 0 skipped one of its 4 steps (its sum holds 3), rank 1 none: mean over the 7 counted steps
    assert guards.interval_mean_loss([3.0, 8.0], [3, 4]) == pytest.approx(11.0 / 7)
    assert math.isnan(guards.interval_mean_loss([0.0, 0.0], [0, 0]))  # every batch skipped
    assert math.isnan(guards.interval_mean_loss([float("nan"), 1.0], [2, 2]))  # unguarded NaN stays visible


def test_a_report_of_the_hang_that_itself_hangs_does_not_keep_the_watchdog_from_exiting(monkeypatch):
    """The volume or channel the report goes to may be what hangs: the exit comes all the same."""
    import threading

    monkeypatch.setattr(guards, "REPORT_WAIT_S", 0.2)
    monkeypatch.setattr(guards, "kill_stopped_siblings", lambda: [])  # the test's siblings are not torchrun's
    clock, exits, never = FakeClock(), [], threading.Event()
    dog = HangWatchdog(1.0, rank=0, exit=exits.append, clock=clock, poll_s=0.01, on_hang=lambda d: never.wait())
    dog.start()
    dog.beat(1)
    clock.now = 5.0
    dog.thread.join(timeout=5)
    never.set()
    assert exits == [1] and dog.fired.detector == "hang"
