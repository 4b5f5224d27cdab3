"""Rows 8c, 8d, 8e and 8f (benchmarks/image_ingest.py) run end to end at the harness's tiny size and land
in results.json and the table. It checks that the figures are produced and well formed, never
how fast anything is or how much memory it takes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from assets.kinds.image_pool import MAX_IMAGES_PER_TASK


# Run by `make bench` before the figures (a minute or more each), not by `make test`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_tiny_image_ingest_rows(tmp_path: Path) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--no-peers", "--only", "image_preprocess",
         "--only", "image_memory", "--only", "image_growth", "--out", str(out), "--data-dir", str(data)],
        cwd=REPO, capture_output=True, text=True, timeout=580)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())["benchmarks"]

    pre = results["image_preprocess"]
    assert set(pre["median_images_per_s"]) == {"platform", "platform_warm", "plain"}
    assert all(r["images"] == pre["images"] == 192 for runs in pre["runs"].values() for r in runs)
    assert pre["same_pixels"] is True  # the platform's samples are the plain script's, pixel for pixel
    assert pre["platform_vs_plain"] > 0 and pre["platform_warm_vs_plain"] > 0 and pre["forkserver_start_s"] > 0

    mem = results["image_memory"]
    assert [mem["sizes"][str(f)]["images"] for f in mem["factors"]] == [12, 48, 192]
    for size in mem["sizes"].values():
        assert size["raw_passed"] and size["accepted"] == size["samples"] == size["images"]
        assert size["peak_tree_rss_bytes"] >= size["peak_main_rss_bytes"] > 0
        # a pool only for more than one task's worth of images (image_pool.workers_for)
        assert size["max_processes"] >= (2 if size["images"] > MAX_IMAGES_PER_TASK else 1)
    assert mem["tree_rss_16x_vs_1x"] > 0 and isinstance(mem["time_exponent"], float)

    grow = results["image_growth"]
    assert grow["added"] == 2 and all(r["samples"] == 192 + 2 for r in grow["runs"])  # 1 % of 192, rounded
    assert all(r["parts"]["reused"] >= 1 and r["parts"]["new"] >= 1 for r in grow["runs"])
    assert grow["grown_vs_full"] > 0

    table = (out / "BENCHMARKS.md").read_text()
    assert "8c. image preprocessing, 192 JPEGs" in table and "same pixels: True" in table
    assert "8d. image ingest memory" in table and "12/48/192 JPEGs" in table
    assert "8e. image-folder ingest time (ingest + shard + checks), 12/48/192 JPEGs" in table
    assert "8f. image-folder ingest of +1 % (2 JPEGs added to 192)" in table
