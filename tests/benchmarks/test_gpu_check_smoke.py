"""The GPU check's whole script on CPU at tiny sizes (``--smoke``: gloo, no compile): every piece
runs through the real entry point, every target gets a verdict, and a smoke run leaves
BENCHMARKS.md alone. The figures mean nothing on CPU; that they are produced and well formed
is what is checked. About 2-3 minutes on 2 cores."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_targets
from benchmarks.gpu_targets import MET, MISSED, NOT_MEASURED

# Run by `make bench` before the figures (minutes), not by `make test`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
TARGETS = 7  # MFU, FSDP (one GPU), images, tokens, checkpoint, guards, launch


@pytest.mark.timeout(900)
def test_smoke_run_on_cpu(tmp_path: Path) -> None:
    benchmarks_md = (REPO / "BENCHMARKS.md").read_bytes()
    p = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke", "--work", str(tmp_path / "w"),
                        "--budget-s", "100000"], cwd=REPO, capture_output=True, text=True, timeout=880, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    r = json.loads((tmp_path / "w" / "gpu_check.json").read_text())
    assert (REPO / "BENCHMARKS.md").read_bytes() == benchmarks_md  # a smoke run leaves the document alone
    status = {v["target"].split(" (")[0]: v["status"] for v in r["verdicts"]}
    assert len(r["verdicts"]) == TARGETS and set(status.values()) <= {MET, MISSED, NOT_MEASURED}
    # measured on CPU too (their verdicts mean nothing there, but they are verdicts)
    for target in ("FSDP ≥ 0.97x DDP", "loader ≥ 2x what the GPU consumes",
                   "telemetry, TensorBoard and guards cost ≤ 1%", "launch → first training step ≤ 5 s"):
        assert status[target] in (MET, MISSED), (target, r["verdicts"])
    assert all(v["status"] in (MET, MISSED) for v in r["verdicts"] if v["target"].startswith("loader"))
    # not measured on CPU: no compile run, and the checkpoint run's model is tiny
    assert status["MFU of the LM with compile ≥ 50%"] == NOT_MEASURED and "compile" in r["not_run"]
    assert status["async checkpoint stall ≤ 1% of step time"] == NOT_MEASURED
    c = r["checkpoint"]
    assert c["saves"] == 2 and c["stall_s_total"] > 0 and c["train_time_s"] > 0
    assert len(r["guards_cost"]["samples_per_s"]["on"]) == 2 and len(r["guards_cost"]["samples_per_s"]["off"]) == 1
    d = r["determinism"]
    assert d["uninterrupted_identical"] is True and d["resumed_identical"] is True and d["resumed_from_step"] == 5
    assert r["ordinal_check"]["refused"] is True
    assert not any(math.isnan(x.get("samples_per_s", math.nan)) for x in r["throughput"].values()), r["throughput"]
    for line in gpu_targets.verdict_lines([gpu_targets.Verdict(**v) for v in r["verdicts"]]):
        assert line in p.stdout
