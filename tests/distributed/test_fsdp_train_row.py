"""Row 5e (benchmarks/fsdp_train.py): the table row from made-up figures, and the sampler that
finds torchrun workers below a command and reads their kernel-kept peak memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from benchmarks.fsdp_train import WorkerMemory
from benchmarks.run import table

MB = 2**20


def _run(peak_mb: float, save_mb: float, sharding: str) -> dict:
    rank = {"peak_rss_bytes": peak_mb * MB, "save_rss_bytes": save_mb * MB, "steps_rss_bytes": peak_mb * MB}
    return {"sharding": sharding, "ranks": {"0": rank, "1": rank}, "peak_rss_bytes": peak_mb * MB,
            "step_time_s": 10.0 if sharding == "ddp" else 13.0, "model_bytes": 577 * MB,
            "checkpoints": {"count": 1, "bytes": 1731 * MB, "best_bytes": 577 * MB},
            "wrapping": {"units": 24, "unit_policy": "by size"} if sharding == "fsdp" else None}


def _entry(ddp_mb: float, fsdp_mb: float) -> dict:
    runs = {"ddp": _run(ddp_mb, ddp_mb - 100, "ddp"), "fsdp": _run(fsdp_mb, fsdp_mb - 50, "fsdp")}
    return {"model": {"d_model": 1024, "layers": 12, "heads": 16, "seq": 128, "batch_per_rank": 2, "chars": 12000},
            "runs": runs, "peak_rss_bytes": {k: v["peak_rss_bytes"] for k, v in runs.items()},
            "save_rss_bytes": {k: v["ranks"]["0"]["save_rss_bytes"] for k, v in runs.items()},
            "steps_rss_bytes": {k: v["ranks"]["0"]["steps_rss_bytes"] for k, v in runs.items()},
            "fsdp_vs_ddp": fsdp_mb / ddp_mb, "step_fsdp_vs_ddp": 1.3}


def _row(text: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| 5e.")]
    return [c.strip() for c in line.strip("|").split(" | ")]


def _results(entry: dict) -> dict:
    return {"machine": {"cpu": "c", "cores": 2, "memory_gib": 1.0, "python": "3", "kernel": "k"},
            "date": "2026-12-03 00:00 UTC", "command": "python -m benchmarks.run", "size": "full", "wall_s": 60.0,
            "load_before": [1, 1, 1], "load_after": [1, 1, 1], "benchmarks": {"fsdp_train": entry}}


def test_the_row_says_the_ratio_the_saves_and_whether_it_meets_its_target():
    met = _row(table(_results(_entry(4000, 2200))))
    assert "python -m pipelines train" in met[0] and "final save included" in met[0]
    assert met[1] == "0.55× DDP" and met[3] == "≤ 0.6× DDP" and met[4] == "met"
    assert "FSDP units 24 (by size)" in met[2] and "FSDP checkpoint 1,731 MB + best weights 577 MB" in met[2]
    assert "in the saves (best weights, checkpoint, model) DDP 3,900 / FSDP 2,150 MB" in met[2]
    assert _row(table(_results(_entry(4000, 2600))))[4] == "**missed**"


def test_the_sampler_finds_a_worker_by_its_torchrun_environment_and_reads_its_peak(tmp_path):
    worker = textwrap.dedent("""
        import time
        block = bytearray(64 << 20)  # touched: resident
        del block
        time.sleep(1.5)
    """)
    env = {**os.environ, "RANK": "1", "TORCHELASTIC_RUN_ID": "x"}
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}])"],
                              env=env)
    try:
        with WorkerMemory(parent.pid, tmp_path) as mem:
            parent.wait(timeout=60)
            time.sleep(0.1)
    finally:
        parent.kill()
    (w,) = [w for w in mem.workers.values() if w["pid"] != parent.pid]  # the parent is a worker by env too
    assert w["rank"] == 1 and w["hwm"] >= 64 << 20 and w["rss"] < w["hwm"]  # freed: RSS fell, the peak stays
