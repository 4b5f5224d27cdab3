"""The rows issue 30 added run end to end at the harness's tiny size and land in results.json and
the table: FSDP memory against DDP (torchrun, 2 gloo ranks), the pipeline's overhead rows (whose
training figures the retrain's reader also gives), a retrain on unchanged data (two
real pipeline runs in one Dagster home), a sweep against its trainings one after another, and
the sweep orchestrator's memory as trials finish. It checks that the figures are produced and
well formed (and that the retrain reused the first run's version), never how fast anything is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Run by `make bench` before the figures (minutes), not by `make test`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_tiny_new_rows(tmp_path: Path) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--no-peers", "--only", "fsdp_memory",
         "--only", "overhead", "--only", "retrain", "--only", "sweep", "--only", "sweep_memory",
         "--out", str(out), "--data-dir", str(data)],
        cwd=REPO, capture_output=True, text=True, timeout=880)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    b = json.loads((out / "results.json").read_text())["benchmarks"]

    fsdp = b["fsdp_memory"]
    assert set(fsdp["runs"]) == {"ddp", "fsdp", "fsdp_ac"} and fsdp["ranks"] == 2 and fsdp["units"] >= 2
    assert all(len(run["ranks"]) == 2 for run in fsdp["runs"].values())
    assert fsdp["fsdp_vs_ddp"] > 0 and fsdp["fsdp_ac_vs_ddp"] > 0 and fsdp["step_s"]["ddp"] > 0

    overhead = b["overhead"]["platform"]
    assert overhead["training_figures"]["steps"] > 0 and overhead["data_assets"]["shards"]["commit_id"]

    retrain = b["retrain"]
    assert retrain["first_reused"] == {"raw_dataset": None, "shards": None}  # the first run made its data
    assert retrain["reused"] is True and retrain["same_shards_commit"] is True
    assert set(retrain["reused_dataset_version"].values()) == {"bench_overhead-d1"}

    sweep = b["sweep"]
    assert sweep["trials"] == 2 and sweep["same_values"] is True and sweep["speedup"] > 0

    memory = b["sweep_memory"]
    assert memory["counts"] == [2, 4] and set(memory["at"]) == {"2", "4"}
    assert memory["at"]["4"]["peak_rss_bytes"] >= memory["at"]["2"]["peak_rss_bytes"] > 0

    table = (out / "BENCHMARKS.md").read_text()
    for row in ("6c. inside the platform's training step", "5c. FSDP per-rank peak memory vs DDP",
                "5d. … with activation checkpointing", "6d. retrain on unchanged data", "reused: yes",
                "9a. sweep, 2 trials 2 at a time", "9b. sweep orchestrator memory"):
        assert row in table
