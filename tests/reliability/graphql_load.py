"""GraphQL readers against a running webserver, and what their latencies and CPU came to.

Each client sends its next read as soon as the answer to the previous one arrived (a closed loop,
as users who reload pages), cycling through a mix of reads, for a fixed time. Latencies are kept
per read, so a slow read is not hidden in the total. The webserver's CPU (and PostgreSQL's, where
it serves the instance) over the same window says which side the time went to: one dagster-
webserver process computes every answer in one Python interpreter, so it cannot use more than
about one core (dagster-io/dagster#29000).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import psutil

UI_QUERIES = Path(__file__).resolve().parent / "ui_queries"


@dataclass(frozen=True)
class Read:
    name: str
    query: str
    variables: dict = field(default_factory=dict)


# The mix the load has used since it was first measured (RELIABILITY.md, "load: GraphQL readers"):
# the latest runs, and every asset with its last five materializations.
READERS = (
    Read("runs", "query { runsOrError(limit: 20) { ... on Runs { results { runId status startTime "
                 "tags { key value } } } } }"),
    Read("assets", "query { assetsOrError { ... on AssetConnection { nodes { key { path } "
                   "assetMaterializations(limit: 5) { runId timestamp metadataEntries { label } } } } } }"),
)


def ui_read(operation: str, **variables) -> Read:
    """One of the operations the Dagster UI itself sends (tests/reliability/ui_queries/)."""
    return Read(operation, (UI_QUERIES / f"{operation}.graphql").read_text(), variables)


def watching_a_model(model: str) -> tuple[Read, ...]:
    """What the UI asks while someone watches ``model``'s training: its checkpoint's page (live
    state, and the Plots of its last 100 materializations and observations), its version's
    latest metadata, and the Runs page."""
    checkpoint = {"path": [model, "checkpoint"]}
    return (
        ui_read("AssetGraphLiveQuery", assetKeys=[checkpoint]),
        ui_read("RecentAssetEventsQuery", assetKey=checkpoint, limit=100,
                eventTypeSelectors=["MATERIALIZATION", "OBSERVATION"]),
        ui_read("AssetOverviewMetadataEventsQuery", assetKey={"path": [model, "model_version"]}),
        ui_read("RunsFeedRootQuery", filter={}, view="ROOTS", limit=30),
    )


@dataclass
class LoadResult:
    clients: int
    duration_s: float
    latencies: dict[str, list[float]]
    errors: list[str]
    webserver_cores: float | None = None
    postgres_cores: float | None = None
    load_average_before: float | None = None

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values())

    def quantiles_ms(self, name: str | None = None) -> tuple[float, float, float]:
        """(p50, p95, p99) in ms of one read, or of all."""
        values = self.latencies[name] if name else [x for v in self.latencies.values() for x in v]
        if len(values) < 2:
            return (float("nan"),) * 3
        q = statistics.quantiles(values, n=100)
        return q[49] * 1000, q[94] * 1000, q[98] * 1000

    def note(self) -> str:
        p50, p95, p99 = self.quantiles_ms()
        per_read = ", ".join(f"{name} {self.quantiles_ms(name)[1]:.0f}" for name in self.latencies)
        cpu = [f"webserver {self.webserver_cores:.2f} cores"] if self.webserver_cores is not None else []
        if self.postgres_cores is not None:
            cpu.append(f"PostgreSQL {self.postgres_cores:.2f} cores")
        machine = f"; 1-min load average before {self.load_average_before:.1f}" if self.load_average_before is not None \
            else ""
        return (f"{self.clients} clients x {self.duration_s:.0f} s: {self.requests} requests, {len(self.errors)} errors, "
                f"p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms (p95 by read: {per_read} ms)"
                + (f"; {', '.join(cpu)}" if cpu else "") + machine)


def _client(url: str, reads: Sequence[Read], stop_at: float, latencies: dict, errors: list, seed: int) -> None:
    i = seed
    while time.monotonic() < stop_at:
        read = reads[i % len(reads)]
        i += 1
        body = json.dumps({"query": read.query, "variables": read.variables}).encode()
        req = urllib.request.Request(url + "/graphql", data=body, headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                payload = json.loads(resp.read())
            if "errors" in payload or resp.status != 200:
                errors.append(f"{read.name}: {str(payload.get('errors'))[:200]}")
            else:
                latencies[read.name].append(time.perf_counter() - t0)
        except Exception as exc:  # every failure is counted and reported, none is hidden
            errors.append(f"{read.name}: {type(exc).__name__}: {exc}")


def webserver_pids(urls: Iterable[str]) -> list[int]:
    """The dagster-webserver processes (children of this one) serving ``urls``."""
    ports = {url.rsplit(":", 1)[1] for url in urls}
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = proc.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "dagster_webserver" in cmd and any(p in cmd for p in ports):
            found.append(proc.pid)
    if len(found) != len(ports):
        raise RuntimeError(f"found {len(found)} dagster-webserver process(es) for {len(ports)} URL(s) {sorted(urls)}")
    return found


def _cpu_s(pid: int, with_children: bool) -> float:
    """CPU seconds of ``pid``; with its reaped children's (PostgreSQL's backends end with their
    connection, and their time is then the postmaster's children's)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + ((t.children_user + t.children_system) if with_children else 0.0)


def run_load(urls: Sequence[str], reads: Sequence[Read], clients: int, duration_s: float,
             postgres_pid: int | None = None) -> LoadResult:
    """``clients`` threads, spread over ``urls`` (one per webserver replica), for ``duration_s``."""
    servers = webserver_pids(urls)
    latencies: dict[str, list[float]] = {r.name: [] for r in reads}
    errors: list[str] = []
    load_before = os.getloadavg()[0]
    cpu0 = [_cpu_s(p, False) for p in servers]
    pg0 = _cpu_s(postgres_pid, True) if postgres_pid else None
    t0 = time.monotonic()
    stop_at = t0 + duration_s
    threads = [threading.Thread(target=_client, args=(urls[i % len(urls)], reads, stop_at, latencies, errors, i))
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return LoadResult(
        clients=clients, duration_s=duration_s, latencies=latencies, errors=errors,
        webserver_cores=sum(_cpu_s(p, False) - c for p, c in zip(servers, cpu0)) / wall,
        postgres_cores=(_cpu_s(postgres_pid, True) - pg0) / wall if postgres_pid else None,
        load_average_before=load_before)
