"""``dagster-webserver`` for tests: its own process group, a free port, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from tests.support.ports import free_ports

REPO = Path(__file__).resolve().parents[2]


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole process group (webserver, code server, run workers), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # the group may be gone already: that is the goal
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=grace_s)


@contextlib.contextmanager
def running_webserver(env: dict[str, str], log_path: Path, start_timeout_s: float = 240.0,
                      workspace: Path | None = None) -> Iterator[str]:
    """Serve the repository's workspace (the platform's code location), or ``workspace``, and
    yield the base URL."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster_webserver", "-w", str(workspace or "workspace.yaml"), "-h", "127.0.0.1",
             "-p", str(port)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_serving(proc, url, log_path, start_timeout_s)
        yield url
    finally:
        _stop_group(proc)


def _wait_until_serving(proc: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/server_info", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1.0)  # not listening yet
    raise TimeoutError(f"dagster-webserver did not answer at {url} within {timeout_s:.0f} s:\n"
                       f"{log_path.read_text()[-3000:]}")
