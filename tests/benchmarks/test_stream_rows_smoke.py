"""Rows 10a-10e (data beyond one node) run end to end at the harness's tiny size against a real
SeaweedFS: torchrun trainings streaming from S3, two torchrun agents as two nodes, the loader
probe. It checks that the figures are produced and consistent with what the runtime reports
(the disk poll against the cache's own count, the nodes' bytes against the split), never how
fast anything is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Run by `make bench` before the figures (minutes), not by `make test`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_tiny_streaming_rows(tmp_path: Path) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    p = subprocess.run([sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--no-peers", "--only", "streaming",
                        "--out", str(out), "--data-dir", str(data)], cwd=REPO, capture_output=True, text=True,
                       timeout=880)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    s = json.loads((out / "results.json").read_text())["benchmarks"]["streaming"]
    assert not [k for k in ("first_step", "cache_bound", "per_node", "loader") if "error" in s[k]], s

    first = s["first_step"]
    assert first["split_bytes"]["16x"] == 16 * first["split_bytes"]["1x"]
    assert all(t > 0 for runs in first["launch_to_first_step_s"].values() for t in runs)

    bound = s["cache_bound"]
    assert bound["split_bytes"] >= 4 * bound["cache_limit"]
    for run in bound["runs"]["s3"]:
        # what was on disk is at least what the cache counted, and the cache was used and emptied
        assert run["disk_peak_bytes"] >= max(run["per_rank_cache_peak_bytes"]) > 0 and run["cache_evictions"] > 0
        assert run["data_bytes_fetched"] >= bound["split_bytes"]
    assert all(run["data_bytes_fetched"] == 0 for run in bound["runs"]["local"])

    node = s["per_node"]
    assert len(node["bytes_per_node"]) == 2 and sum(node["bytes_per_node"]) >= node["split_bytes"]
    assert all(b > 0 for b in node["bytes_per_node"])

    loader = s["loader"]
    assert all(r["bytes_fetched_while_timed"] == 0 for r in loader["runs"]["s3"])  # the cache was warm
    assert all(r["fill_s"] > 0 for r in loader["runs"]["s3"]) and loader["s3_vs_local"] > 0

    assert "10a." in (out / "BENCHMARKS.md").read_text()


@pytest.mark.timeout(600)
def test_tiny_shard_workers_row(tmp_path: Path) -> None:
    """10d at the tiny size: both sides shard the same folder into the same pixels, the 1-CPU side
    with a pool of one process."""
    out, data = tmp_path / "out", tmp_path / "data"
    p = subprocess.run([sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--no-peers", "--only", "shard_workers",
                        "--out", str(out), "--data-dir", str(data)], cwd=REPO, capture_output=True, text=True,
                       timeout=580)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    e = json.loads((out / "results.json").read_text())["benchmarks"]["shard_workers"]
    assert e["same_pixels"] and e["pool_workers"] == {"1": 1, "2": 2} and e["speedup_2_vs_1"] > 0
    assert [len(r["cpus"]) for r in e["runs"]["1"]] == [1] and "10d." in (out / "BENCHMARKS.md").read_text()
