"""Row 7c (benchmarks/table_growth.py) runs end to end at the harness's tiny size and lands in
results.json and the table: a table's second version with 1 % of rows appended, built on the first
version's parts, against a full ingest, both whole runs of the dataset's job. It checks that the
figures are produced and well formed and that the edit kept parts, never how fast anything is."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Run by `make bench` before the figures, not by `make test`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_tiny_table_growth_row(tmp_path: Path) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--no-peers", "--only", "table_growth",
         "--out", str(out), "--data-dir", str(data)],
        cwd=REPO, capture_output=True, text=True, timeout=580)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    e = json.loads((out / "results.json").read_text())["benchmarks"]["table_growth"]
    assert e["rows"] == 300 * 16 and e["added"] == 48  # row 7's 16x CSV at the tiny size, and 1 % of it
    for run in e["runs"]:
        assert run["grown"]["wall_s"] > 0 and run["full"]["wall_s"] > 0
        assert set(run["grown"]["step_seconds"]) >= {"raw_dataset", "shards"}
        sharded, checked = run["grown"]["shards_log"]
        kept = int(re.search(r"the other (\d+) kept", sharded).group(1))
        assert kept >= 1 and 1 <= run["grown"]["parts_made"] < run["grown"]["parts"]
        assert "counted by their parts' summaries" in checked  # the kept parts' shards were not read back
        assert run["full"]["parts_made"] == run["full"]["parts"]  # the full ingest had nothing to keep
    assert e["grown_vs_full"] > 0
    assert "7c. table ingest of +1 % (48 rows appended to 4,800, 11 MB CSV, 512 rows a shard)" in \
        (out / "BENCHMARKS.md").read_text()
