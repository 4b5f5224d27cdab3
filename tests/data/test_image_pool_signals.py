"""The image worker pool stops, rather than hangs, when a worker dies while the others hold large
results, even in a host that ignores SIGTERM (assets/kinds/image_pool.py ``_worker_signals``).

The executor stops the other workers of a broken pool with SIGTERM and joins them. Workers inherit
the signal dispositions of the process that started the forkserver, so in a host that ignores
SIGTERM a worker blocked writing a result bigger than a pipe's buffer ignored it and the step hung
(CI caught it in tests/reliability/test_data_faults.py). Each case runs in a fresh interpreter, so
its forkserver starts there, from a process that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TASKS = '''
import os, signal, time
import numpy as np

def task(i):
    if i == 1:  # one worker killed, as the OOM killer would, while the other is still at work
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    return np.full(4 << 20, i, dtype=np.uint8)  # far more than a pipe holds: the sender blocks until read

def sigterm(_):
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
'''


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "pool_tasks.py").write_text(TASKS)
    script = textwrap.dedent(f"""
        import signal, sys, time
        sys.path[:0] = [{str(REPO)!r}, {str(tmp_path)!r}]
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the host ignores SIGTERM before any pool starts
        from assets.kinds.image_pool import WorkerPool
        import pool_tasks
    """) + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its forkserver and workers in its group
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # the pool hung: no process of it may outlive the test
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the pool hung after a worker died: {err[-2000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_workers_take_sigterm_whatever_their_host_does(tmp_path):
    proc = _run(tmp_path, """
        with WorkerPool(2) as pool:
            print(sorted({ok for _, ok in pool.ordered(pool_tasks.sigterm, ((i, i) for i in range(8)))}))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[True]"


def test_a_worker_killed_while_others_hold_large_results_stops_the_pool(tmp_path):
    proc = _run(tmp_path, """
        t0 = time.monotonic()
        try:
            with WorkerPool(2) as pool:
                for _ in pool.ordered(pool_tasks.task, ((i, i) for i in range(12))):
                    pass
        except RuntimeError as exc:
            print("stopped:", exc, f"after {time.monotonic() - t0:.1f}s")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]  # _run fails the test if the pool hangs
    assert "stopped: an image worker process died" in proc.stdout, proc.stdout + proc.stderr[-2000:]
