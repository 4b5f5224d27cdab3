"""The benchmarks' real-memory limit (benchmarks/memcg.py): which cgroup a process is in, read
from /proc/self/cgroup's text (pure), and, where this machine lets a memory cgroup be made, a
process that joins one and is killed past its limit while one under it completes."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import memcg

V1 = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n"
V2 = "0::/user.slice/session-1.scope\n"


def test_the_v1_memory_hierarchy_is_found_where_it_is_mounted(tmp_path):
    (tmp_path / "memory").mkdir()
    assert memcg.own_cgroup(V1, tmp_path) == ("v1", tmp_path / "memory" / "process_api" / "abc")


def test_the_unified_hierarchy_is_used_where_it_offers_the_memory_controller(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert memcg.own_cgroup(V2, tmp_path) == ("v2", tmp_path / "user.slice" / "session-1.scope")


def test_no_memory_controller_means_no_cgroup(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu pids\n")
    assert memcg.own_cgroup(V2, tmp_path) is None
    assert memcg.own_cgroup(V1, tmp_path) is None  # v1 line, but no memory hierarchy mounted


GROW = """
import sys
from benchmarks import memcg
memcg.join(sys.argv[1])
blocks = [bytearray(1 << 20) for _ in range(int(sys.argv[2]))]  # touched: bytearray zero-fills
print(len(blocks))
"""


def test_a_process_past_its_cgroups_limit_is_killed_and_one_under_it_completes():
    with memcg.limited_cgroup(48 << 20, "test-memcg") as cg:
        if cg is None:
            pytest.skip("no writable memory cgroup on this machine")
        version, path = cg

        def run(mb: int) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-c", GROW, str(path), str(mb)], capture_output=True, text=True,
                                  cwd=Path(__file__).resolve().parents[2], timeout=120)
        under, over = run(16), run(96)
        assert under.returncode == 0 and under.stdout.strip() == "16", under.stderr
        assert over.returncode == -9, (over.returncode, over.stderr[-400:])
        peak = memcg.peak_bytes(version, path)
        assert peak is not None and 16 << 20 <= peak <= 48 << 20
    assert not path.exists()
