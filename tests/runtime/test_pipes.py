"""The entry point without torchrun, reporting through a real Dagster Pipes file channel."""

import json
import os
import subprocess
import sys

import pytest
from dagster_pipes import encode_param

from tests.runtime.helpers import REPO, make_config, make_dataset

pytestmark = pytest.mark.slow


def _pipes_env(tmp_path):
    context = {"asset_keys": ["model_checkpoint"], "code_version_by_asset_key": None,
               "provenance_by_asset_key": None, "partition_key": None, "partition_key_range": None,
               "partition_time_window": None, "run_id": "r1", "job_name": None, "retry_number": 0,
               "extras": {}}
    messages = tmp_path / "messages.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "RANK", "WORLD_SIZE"))}
    env.update(DAGSTER_PIPES_CONTEXT=encode_param({"data": context}),
               DAGSTER_PIPES_MESSAGES=encode_param({"path": str(messages)}),
               PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return env, messages


def _run(cfg, tmp_path, env):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([sys.executable, "-m", "training_runtime", "--config", str(path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)


def test_rank0_reports_progress_telemetry_and_final_figures(tmp_path):
    manifest, locations = make_dataset(tmp_path, n_train=64, n_test=16, per_shard=32)
    cfg = make_config(tmp_path, manifest, locations, max_steps=8)
    cfg["telemetry"]["every_steps"] = 4
    env, messages = _pipes_env(tmp_path)
    proc = _run(cfg, tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    msgs = [json.loads(line) for line in messages.read_text().splitlines()]
    assert msgs[0]["method"] == "opened" and msgs[-1]["method"] == "closed"
    assert "report_asset_materialization" not in {m["method"] for m in msgs}
    logs = [m["params"]["message"] for m in msgs if m["method"] == "log"]
    assert any("step 8/8 (100%)" in line and "ETA" in line for line in logs)
    custom = [m["params"]["payload"] for m in msgs if m["method"] == "report_custom_message"]
    tele = [c for c in custom if c["kind"] == "telemetry"]
    assert [t["step"] for t in tele] == [4, 8]
    for key in ("loss", "lr", "samples_per_second", "data_wait_share", "per_rank_step_time_s",
                "per_rank_data_wait_share", "cpu_percent", "rss_bytes"):
        assert key in tele[0], key
    final = [c for c in custom if c["kind"] == "final"]
    assert len(final) == 1 and final[0]["steps"] == 8 and final[0]["world_size"] == 1
    assert "loss_history" not in final[0]
    metrics = json.loads((tmp_path / "run" / "out" / "metrics.json").read_text())
    assert metrics["final_loss"] == final[0]["final_loss"]


def test_failure_is_passed_to_dagster(tmp_path):
    manifest, locations = make_dataset(tmp_path, n_train=64, n_test=16, per_shard=32)
    cfg = make_config(tmp_path, manifest, locations, model="resnet50")
    env, messages = _pipes_env(tmp_path)
    proc = _run(cfg, tmp_path, env)
    assert proc.returncode != 0
    closed = json.loads(messages.read_text().splitlines()[-1])
    assert closed["method"] == "closed"
    assert "model.name 'resnet50' is unknown" in closed["params"]["exception"]["message"]
