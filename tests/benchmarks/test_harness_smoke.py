"""The benchmark harness runs end to end at its tiny size (no peers' venv) and writes its outputs.
It checks that figures are produced and well formed, never how fast anything is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


# Run by `make bench` before the figures (a minute or more each), not by `make test`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_tiny_harness_writes_results_and_table(tmp_path: Path) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--no-peers", "--only", "loaders",
         "--only", "checkpoint", "--only", "scaling", "--only", "guards", "--out", str(out), "--data-dir", str(data)],
        cwd=REPO, capture_output=True, text=True, timeout=580)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["size"] == "tiny" and results["machine"]["cores"] >= 1
    loaders = results["benchmarks"]["loaders"]["sizes"]
    for label in ("4KB", "192KB"):
        ratios = loaders[label]["vs_memory_read_limit"]
        assert ratios["memmap"] == 1.0 and ratios["ours"] > 0 and ratios["ours_before"] > 0
        assert set(loaders[label]["errors"]) == {"streaming", "webdataset", "pandas"}  # peers skipped, said so
    ckpt = results["benchmarks"]["checkpoint"]
    assert ckpt["checkpoint_loads"] is True and ckpt["async_checkpoint_loads"] is True
    assert ckpt["sync_vs_torch_save"] > 0 and ckpt["durable_vs_torch_save_fsync"] > 0
    assert ckpt["async_stall_vs_sync"] > 0
    scaling = results["benchmarks"]["scaling"]
    assert set(scaling["median_samples_per_s"]) == {"1", "2", "2_independent"}
    assert scaling["efficiency"] > 0 and scaling["independent_efficiency"] > 0
    guards = results["benchmarks"]["guards"]
    assert len(guards["runs"]["on"]) == len(guards["runs"]["off"]) == 1 and guards["steps"] == 4
    alone = guards["guard_step"]  # the guards' own per-step work timed on real gradients
    assert 0 < alone["guard_s"] < alone["step_s"] and alone["runs"]["parameters"] > 10**6
    table = (out / "BENCHMARKS.md").read_text()
    assert "<!-- results:begin -->" in table and "1. loader throughput, 4KB" in table
    assert "4a. checkpoint" in table and "two independent 1-rank runs" in table and "guards' own per-step work alone" in table and "not measured (peers not run (--no-peers))" in table
