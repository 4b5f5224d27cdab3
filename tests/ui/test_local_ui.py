"""``make ui``'s two servers start and stop together (pipelines/local_ui.py), shown with stand-in
servers that record their pids and each start a child of their own: one ending stops the other, a
Ctrl+C stops both, and nothing of either group is left. Also what it starts and with which
addresses, on a temporary home."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.tensorboard_events import tensorboard_logdir
from pipelines.local_ui import run_together, ui_commands, ui_environment
from pipelines.profiles import TENSORBOARD_URL_ENV, Profile, served_tensorboard_url, served_ui_url
from tests.ui.webserver import REPO

# A server stand-in: writes its pid and its child's pid to a file, then serves "forever" (or exits with CODE).
SERVER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write("%d %d" % (os.getpid(), child.pid))
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def _server(pid_file: Path, lives_s: float, code: int = 0) -> list[str]:
    return [sys.executable, "-c", SERVER, str(pid_file), str(lives_s), str(code)]


def _alive(pid: int) -> bool:
    """Running: a zombie (exited, its parent gone or not yet reaping it) counts as gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "(zombie)" not in status


def _pids(pid_file: Path, timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid_file.exists() and pid_file.read_text().strip():
            return [int(p) for p in pid_file.read_text().split()]
        time.sleep(0.05)
    raise TimeoutError(f"{pid_file} never written")


def _gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_when_one_server_ends_the_other_is_stopped_with_its_children(tmp_path):
    ui, board = tmp_path / "ui.pids", tmp_path / "board.pids"
    started = time.monotonic()
    code = run_together({"dagster dev": _server(ui, 600), "TensorBoard": _server(board, 1.0, code=3)},
                        dict(os.environ), cwd=tmp_path, grace_s=5)
    assert code == 3  # the status of the one that ended: the UI is not fully up any more
    assert _gone(_pids(ui) + _pids(board)), "a server or a child of one outlived make ui"
    assert time.monotonic() - started < 30


def test_ctrl_c_stops_both(tmp_path):
    ui, board = tmp_path / "ui.pids", tmp_path / "board.pids"
    script = (f"import sys, os; sys.path.insert(0, {str(REPO)!r}); from pipelines.local_ui import run_together; "
              f"sys.exit(run_together({{'a': {_server(ui, 600)!r}, 'b': {_server(board, 600)!r}}}, dict(os.environ), "
              "grace_s=5))")
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        pids = _pids(ui) + _pids(board)
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=30) == 0
        assert _gone(pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_what_make_ui_starts_and_the_addresses_it_hands_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PLATFORM_PROFILE", raising=False)
    env = ui_environment({}, host="127.0.0.1", port=3005, tensorboard_port=6010)
    # The code location, the run workers and the servers all read these (pipelines/profiles.py).
    assert served_ui_url(env) == "http://127.0.0.1:3005"
    assert served_tensorboard_url(env) == "http://127.0.0.1:6010"
    # A URL the user set (a proxy in front) is kept.
    assert ui_environment({TENSORBOARD_URL_ENV: "https://tb.example.com"}, host="0.0.0.0", port=1,
                          tensorboard_port=2)[TENSORBOARD_URL_ENV] == "https://tb.example.com"
    profile = Profile.from_environment()
    commands = ui_commands(profile, host="127.0.0.1", tensorboard_port=6010, workspace=tmp_path / "workspace.yaml")
    assert commands["dagster dev"][1:] == ["-m", "dagster", "dev", "-w", str(tmp_path / "workspace.yaml")]
    logdir = tensorboard_logdir(profile.resources()["artifacts"].get())
    assert logdir == str(tmp_path / "home" / "platform" / "artifacts" / "models")
    assert commands["TensorBoard"][1:4] == ["-m", "tensorboard.main", f"--logdir={logdir}"]
    assert "--port=6010" in commands["TensorBoard"] and "--host=127.0.0.1" in commands["TensorBoard"]
    with pytest.raises(SystemExit, match="local profile"):
        ui_commands(Profile(name="kubernetes", data_root=tmp_path), host="h", tensorboard_port=1, workspace=tmp_path)
