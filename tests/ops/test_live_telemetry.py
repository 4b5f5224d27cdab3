"""Rank 0's telemetry and detections as they arrive: the observation metadata a telemetry message
becomes, the log line of a detection, and a real Pipes session whose reader forwards them."""

import math
import sys
import textwrap

import dagster as dg
import pytest

from resources.launch.live_telemetry import (
    ForwardingMessageHandler,
    LiveTempFileMessageReader,
    detection_log_line,
    per_rank_summary,
    telemetry_metadata,
)

TELEMETRY = {
    "kind": "telemetry", "step": 40, "epoch": 2, "loss": 0.52, "lr": 0.003, "samples_per_second": 812.5,
    "grad_norm": 1.25, "data_wait_share": 0.1, "cpu_percent": 97.0, "rss_bytes": 512_000_000,
    "per_rank_step_time_s": [0.01, 0.02, 0.04], "per_rank_data_wait_share": [0.1, 0.3],
    "per_rank_gpu_temperature_c": [61.0, 64.0], "gpu_name": "NVIDIA H200", "gpu_throttle_reasons": ["sw_power_cap"],
}


def _values(meta: dict) -> dict:
    return {k: (type(v).__name__, v.value) for k, v in meta.items()}


def test_a_telemetry_message_becomes_numbers_the_plots_chart():
    meta = telemetry_metadata(TELEMETRY)

    values = _values(meta)
    assert values["step"] == ("IntMetadataValue", 40) and values["epoch"] == ("IntMetadataValue", 2)
    assert values["rss_bytes"] == ("IntMetadataValue", 512_000_000)
    for name in ("loss", "lr", "samples_per_second", "grad_norm", "data_wait_share", "cpu_percent"):
        assert values[name] == ("FloatMetadataValue", TELEMETRY[name]), name
    # Per-rank lists: slowest, fastest and slowest over the median, which shows a straggler.
    assert values["per_rank_step_time_s_max"] == ("FloatMetadataValue", 0.04)
    assert values["per_rank_step_time_s_min"] == ("FloatMetadataValue", 0.01)
    assert values["per_rank_step_time_s_max_over_median"] == ("FloatMetadataValue", 2.0)
    assert values["per_rank_data_wait_share_max_over_median"] == ("FloatMetadataValue", pytest.approx(1.5))
    assert "per_rank_step_time_s" not in meta
    # Text and lists of text are not figures; nothing names the message kind.
    assert not {"kind", "gpu_name", "gpu_throttle_reasons"} & meta.keys()


def test_figures_the_chart_cannot_place_are_left_out():
    meta = telemetry_metadata({"kind": "telemetry", "step": 3, "loss": math.nan, "grad_norm": math.inf,
                               "stopped": True, "per_rank_step_time_s": [0.1, math.nan]})
    assert set(meta) == {"step"}
    assert per_rank_summary("per_rank_x", []) == {}
    assert set(per_rank_summary("per_rank_x", [0.0, 0.0])) == {"per_rank_x_max", "per_rank_x_min"}  # no ratio to 0


def test_the_last_validation_rides_along_with_later_telemetry():
    validation = {"kind": "validation", "step": 30, "validation_loss": 0.61, "validation_accuracy": 0.83,
                  "best_step": 30, "monitor": "accuracy"}
    values = _values(telemetry_metadata(TELEMETRY, validation))
    assert values["validation_accuracy"] == ("FloatMetadataValue", 0.83)
    assert values["validation_loss"] == ("FloatMetadataValue", 0.61)
    assert values["validation_step"] == ("IntMetadataValue", 30)
    assert values["step"] == ("IntMetadataValue", 40)  # the telemetry's own step is kept
    assert "best_step" not in values and "monitor" not in values


def test_a_detection_is_a_warning_or_an_error_naming_where_it_fired():
    straggler = {"kind": "detection", "detector": "straggler", "severity": "warning", "step": 120, "rank": 3,
                 "host": "node-b", "gpu": "GPU-7", "message": "rank 3 takes 2.1x the median step time"}
    assert detection_log_line(straggler) == (
        "warning", "training health: straggler at step 120, rank 3, node-b, GPU-7: rank 3 takes 2.1x the median "
                   "step time")
    nonfinite = {"kind": "detection", "detector": "nonfinite", "severity": "error", "step": 7, "rank": None,
                 "host": None, "gpu": None, "message": "loss is nan"}
    assert detection_log_line(nonfinite) == ("error", "training health: nonfinite at step 7: loss is nan")


class _Log:
    def __init__(self):
        self.warnings: list[str] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)


class _Handler:
    """The parts of a PipesMessageHandler a reader uses."""

    def __init__(self):
        self.messages: list[dict] = []
        self._context = type("Context", (), {"log": _Log()})()
        self.received_closed_message = False

    def handle_message(self, message: dict) -> None:
        self.messages.append(message)


def test_a_failing_live_view_costs_no_message():
    def broken(payload):
        raise ValueError("cannot show this")

    handler = _Handler()
    forwarding = ForwardingMessageHandler(handler, broken)
    custom = {"method": "report_custom_message", "params": {"payload": {"kind": "telemetry", "step": 1}}}
    forwarding.handle_message(custom)
    forwarding.handle_message({"method": "closed", "params": {}})

    assert handler.messages == [custom, {"method": "closed", "params": {}}]
    (warning,) = handler._context.log.warnings
    assert "could not show a training message live" in warning and "cannot show this" in warning
    assert forwarding.received_closed_message is False  # the rest is the real handler's


# A stand-in for rank 0: reports through a real Pipes file channel, as training_runtime/observe/pipes.py does.
WORKER = textwrap.dedent("""
    from dagster_pipes import open_dagster_pipes
    with open_dagster_pipes() as pipes:
        pipes.report_custom_message({"kind": "telemetry", "step": 10, "epoch": 1, "loss": 1.5,
                                     "per_rank_step_time_s": [0.02, 0.03]})
        pipes.report_custom_message({"kind": "validation", "step": 10, "validation_accuracy": 0.5})
        pipes.report_custom_message({"kind": "telemetry", "step": 20, "epoch": 1, "loss": 0.9,
                                     "per_rank_step_time_s": [0.02, 0.02]})
        pipes.report_custom_message({"kind": "detection", "detector": "data_stall", "severity": "warning",
                                     "step": 20, "rank": 1, "host": None, "gpu": None,
                                     "message": "rank 1 waits for batches 45% of its step time"})
        pipes.report_custom_message({"kind": "final", "steps": 20})
""")


def test_the_local_reader_turns_telemetry_into_observations_of_the_asset(tmp_path):
    custom: list = []

    @dg.asset(key=["tiny", "checkpoint"])
    def checkpoint(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        client = dg.PipesSubprocessClient(message_reader=LiveTempFileMessageReader(context=context))
        invocation = client.run(context=context, command=[sys.executable, "-c", WORKER])
        custom.extend(invocation.get_custom_messages())
        return dg.MaterializeResult()

    with dg.instance_for_test() as instance:
        result = dg.materialize([checkpoint], instance=instance)
        assert result.success
        observations = result.get_asset_observation_events()
        logs = [r.event_log_entry for r in instance.get_records_for_run(result.run_id).records
                if r.event_log_entry.dagster_event is None]

    # The session still collects every custom message for the op that reads them afterwards.
    assert [m["kind"] for m in custom] == ["telemetry", "validation", "telemetry", "detection", "final"]
    assert [o.asset_key for o in observations] == [dg.AssetKey(["tiny", "checkpoint"])] * 2
    first, second = (o.asset_observation_data.asset_observation.metadata for o in observations)
    assert (first["step"].value, first["loss"].value) == (10, 1.5)
    assert first["per_rank_step_time_s_max_over_median"].value == pytest.approx(0.03 / 0.025)
    assert "validation_accuracy" not in first
    assert (second["step"].value, second["validation_accuracy"].value, second["validation_step"].value) == (20, 0.5, 10)
    (stall,) = [e for e in logs if "training health: data_stall" in e.user_message]
    assert stall.level == 30  # logging.WARNING
    assert "rank 1 waits for batches 45%" in stall.user_message
