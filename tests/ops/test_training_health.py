"""The checkpoint's training-health check: passes without detections, warns with them, reads the
metrics.json committed beside the weights, and never blocks what comes after the checkpoint."""

import json

import dagster as dg

from ops.training_health import (
    CHECK_NAME,
    LISTED,
    build_training_health_check,
    checkpoint_metrics_path,
    training_health_result,
)
from resources.platform import VersionedStoreResource

STRAGGLER = {"detector": "straggler", "severity": "warning", "step": 120, "rank": 3, "host": "node-b",
             "gpu": "GPU-7", "message": "rank 3 takes 2.1x the median step time"}
STALL = {"detector": "data_stall", "severity": "warning", "step": 80, "rank": 1, "host": None, "gpu": None,
         "message": "rank 1 waits for batches 45% of its step time"}
SPIKE = {"detector": "loss_spike", "severity": "warning", "step": 200, "rank": None, "host": None, "gpu": None,
         "message": "loss 9.1 is 4.2x the median | of the last 10 intervals"}


def test_a_training_without_detections_passes():
    for metrics in ({"final_loss": 0.2, "detections": []}, {"final_loss": 0.2}):
        result = training_health_result(metrics)
        assert result.passed is True and result.severity == dg.AssetCheckSeverity.WARN
        assert result.metadata["detections"].value == 0
        assert "detected" not in result.metadata


def test_detections_fail_the_check_as_a_warning_listing_them():
    result = training_health_result({"detections": [STALL, STRAGGLER, SPIKE, dict(STRAGGLER, step=170)]})

    assert result.passed is False and result.severity == dg.AssetCheckSeverity.WARN
    counts = {k: v.value for k, v in result.metadata.items() if k.startswith("detections")}
    assert counts == {"detections": 4, "detections_data_stall": 1, "detections_loss_spike": 1,
                      "detections_straggler": 2}
    table = result.metadata["detected"].value.splitlines()
    assert table[2] == "| data_stall | warning | 80 | 1 |  | rank 1 waits for batches 45% of its step time |"
    assert table[3] == "| straggler | warning | 120 | 3 | node-b, GPU-7 | rank 3 takes 2.1x the median step time |"
    assert table[4] == ("| loss_spike | warning | 200 |  |  | loss 9.1 is 4.2x the median \\| of the last 10 "
                        "intervals |")  # a | in a message does not split the row
    assert result.description.startswith("4 detection(s): data_stall at step 80 on rank 1: rank 1 waits")
    assert result.description.endswith("(and 1 more)")


def test_a_long_list_is_cut_but_counted():
    many = [dict(STALL, step=s) for s in range(LISTED + 5)]
    result = training_health_result({"detections": many})
    assert result.metadata["detections_data_stall"].value == LISTED + 5
    rows = [line for line in result.metadata["detected"].value.splitlines() if line.startswith("| data_stall")]
    assert len(rows) == LISTED
    assert result.metadata["detected"].value.endswith("5 more in metrics.json")


def test_the_check_reads_the_metrics_committed_beside_the_weights_and_does_not_block(tmp_path):
    key = dg.AssetKey(["tiny", "checkpoint"])
    store = VersionedStoreResource(kind="local", local_root=str(tmp_path / "store"))
    folder = "models/tiny/checkpoints/run-1/"

    @dg.asset(key=key)
    def checkpoint(store: VersionedStoreResource) -> dict:
        s = store.get()
        s.ensure_repository()
        s.create_branch("run-1", exist_ok=True)
        s.put_object("run-1", folder + "metrics.json", json.dumps({"detections": [STRAGGLER]}).encode())
        commit = s.commit("run-1", "Train tiny", {})
        return {"commit_id": commit.id, "weights_path": folder + "model.safetensors"}

    @dg.asset(key=["tiny", "model_version"], deps=[key])
    def model_version() -> None:
        """Stands for the evaluation that follows the checkpoint."""

    check = build_training_health_check(key)
    assert {spec.name: spec.blocking for spec in check.check_specs} == {CHECK_NAME: False}
    result = dg.materialize([checkpoint, model_version, check], resources={"store": store}, raise_on_error=False)

    assert result.success  # a failed WARN check fails no step
    (evaluation,) = result.get_asset_check_evaluations()
    assert (evaluation.check_name, evaluation.passed, evaluation.severity) == (CHECK_NAME, False,
                                                                              dg.AssetCheckSeverity.WARN)
    assert evaluation.metadata["detections_straggler"].value == 1
    assert {m.asset_key for m in result.get_asset_materialization_events()} == {key, dg.AssetKey(["tiny",
                                                                                               "model_version"])}
    assert checkpoint_metrics_path({"weights_path": folder + "model.safetensors"}) == folder + "metrics.json"
