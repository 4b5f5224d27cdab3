"""Helpers shared by the benchmark harness: paths, subprocess probes that print JSON, medians,
peak-memory sampling, machine facts and the log-log growth fit. Imports nothing heavy."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
DATA = BENCH / "data"
VENV_PY = REPO / ".venv" / "bin" / "python"
PEERS_VENV = BENCH / ".peers-venv"
PEERS_PY = PEERS_VENV / "bin" / "python"


class ProbeError(RuntimeError):
    """A benchmark subprocess failed; the message holds the command and its stderr tail."""


def run_json(cmd: list[str], *, timeout: float, env: dict[str, str] | None = None,
             cwd: Path = REPO, preexec=None) -> dict:
    """Run ``cmd``; its last stdout line must be one JSON object, which is returned. ``preexec``
    runs in the child before it starts (e.g. to set a resource limit it must start with)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd,
                           preexec_fn=preexec)
    except subprocess.TimeoutExpired as e:
        raise ProbeError(f"{' '.join(map(str, cmd))} ran past {timeout:.0f} s") from e
    lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout)[-1500:]
        raise ProbeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {tail}")
    return json.loads(lines[-1])


def emit(obj: dict) -> None:
    """A probe's result: one JSON line on stdout."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def rotate(items: list, k: int) -> list:
    """Interleaving: repetition k starts the round at a different item."""
    k %= max(1, len(items))
    return items[k:] + items[:k]


def fit_exponent(sizes: list[float], times: list[float]) -> float:
    """Least-squares slope of log(time) on log(size): 1.0 is linear growth."""
    xs = [math.log(s) for s in sizes]
    ys = [math.log(max(t, 1e-9)) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


class PeakMemory:
    """Samples this process's RSS and anonymous RSS from /proc every ``interval`` seconds.
    Anonymous memory is what a bounded-memory design must keep flat; page-cache pages of
    memory-mapped shards count in RSS but are reclaimable."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.peak_rss = self.peak_anon = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")

    @staticmethod
    def read() -> tuple[int, int]:
        rss = anon = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
        return rss, anon

    def _sample(self) -> None:
        rss, anon = self.read()
        self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.start_rss, self.start_anon = self.read()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "kernel": platform.release()}


def now() -> float:
    return time.perf_counter()
