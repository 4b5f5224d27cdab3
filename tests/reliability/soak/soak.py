"""One soak: start the platform, run load and faults for the set minutes, drain, check, report.

Threads: new-data commits, wine retrains, the GraphQL reader, the footprint sampler, the fault
scheduler and the invariant rounds. When the time is up, commits, retrains and faults stop
(S3 and the store are brought back if a fault had them down), the runs in flight are waited
for, and the invariants are checked a last time, run outcomes included. ``run_soak`` returns
the soak's record (JSON-ready), which tests/reliability/report.py renders into RELIABILITY.md.
"""

from __future__ import annotations

import os
import platform as host
import random
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import dagster as dg
from dagster_graphql import DagsterGraphQLClient

from pipelines.automation import IN_FLIGHT
from tests.reliability.soak.faults import (
    KUBERNETES_CLASSES,
    LOCAL_CLASSES,
    FaultContext,
    FaultScheduler,
    training_ranks,
)
from tests.reliability.soak.footprint import Footprint, leftover_temporaries
from tests.reliability.soak.invariants import INVARIANTS, Checker
from tests.reliability.soak.load import Clock, Commits, GraphQLReader, Retrains
from tests.reliability.soak.platform import SoakPlatform
from tests.reliability.soak.profile import LOCAL
from tests.reliability.soak.settings import SoakSettings

QUIET_S = 45.0  # the drain ends once no run has been in flight for this long


def _thread(name: str, target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=f"soak-{name}", daemon=True)
    thread.start()
    return thread


def _drain(instance: dg.DagsterInstance, timeout_s: float) -> tuple[float, list[str]]:
    """Wait until no run has been queued or running for QUIET_S; (seconds waited, runs still in flight)."""
    started = time.monotonic()
    quiet_since = None
    while time.monotonic() - started < timeout_s:
        busy = [r.run_id for r in instance.get_runs(dg.RunsFilter(statuses=IN_FLIGHT))]
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            return time.monotonic() - started, []
        time.sleep(3.0)
    return time.monotonic() - started, [r.run_id for r in instance.get_runs(dg.RunsFilter(statuses=IN_FLIGHT))]


def _restore_services(platform: SoakPlatform) -> None:
    """Whatever a fault left down comes back before the drain (the scheduler restores as it
    ends each fault; this covers a fault cut short by the end of the soak)."""
    platform.lakefs.proxy.clear()
    if platform.seaweed.process is None or platform.seaweed.process.poll() is not None:
        platform.seaweed.start()


def run_soak(settings: SoakSettings, root: Path, launcher: str = LOCAL) -> dict:
    minutes = settings.minutes if launcher == LOCAL else settings.k8s_minutes
    classes = settings.classes_for(LOCAL_CLASSES if launcher == LOCAL else KUBERNETES_CLASSES)
    clock = Clock()
    load_stop, watch_stop = threading.Event(), threading.Event()
    with SoakPlatform(root, launcher) as platform, dg.DagsterInstance.from_config(str(platform.home)) as instance:
        started_at = time.time()
        user_store = platform.store_resource(through_faults=True).get()
        user_store.ensure_repository()
        port = int(platform.url.rsplit(":", 1)[1])
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        commits = Commits(user_store, random.Random(f"{settings.seed}:commits"), clock, settings.commit_every_s)
        first = commits.commit_once()  # the first digits data: its sensor starts the first run
        if not first["ok"]:
            raise RuntimeError(f"the soak's first digits commit failed: {first['error']}")
        retrains = Retrains(client, platform.home, "wine", clock)
        reader = GraphQLReader(platform.url, clock)
        footprint = Footprint(platform, clock, settings.sample_every_s)
        fault_instance = stack_instance(platform)
        scheduler = FaultScheduler(FaultContext(platform, fault_instance, client, clock, load_stop),
                                   sorted(classes), settings.seed, settings.gap_for(minutes))
        checker = Checker(platform, stack_instance(platform), clock, scheduler.faults)

        def rounds(stop: threading.Event) -> None:
            while not stop.wait(settings.check_every_s):
                checker.round()

        loads = [_thread("commits", commits.run, load_stop), _thread("retrains", retrains.run, load_stop),
                 _thread("faults", scheduler.run)]
        watchers = [_thread("graphql", reader.run, watch_stop), _thread("footprint", footprint.run, watch_stop),
                    _thread("checks", rounds, watch_stop)]
        load_stop.wait(minutes * 60)
        load_stop.set()
        for thread in loads:
            thread.join(timeout=600)
        load_ended = clock.now()
        try:
            _restore_services(platform)
        except Exception as exc:  # noqa: BLE001 - the platform's state is still checked, and this reported
            checker.violation("services", f"a service a fault had stopped did not come back: {exc!r}"[:1500])
        drain_s, stuck = _drain(instance, settings.drain_timeout_s)
        watch_stop.set()
        for thread in watchers:
            thread.join(timeout=900)
        checker.round(final=True)
        footprint.sample()
        succeeded_roots = {o.root for o in checker.outcomes.values() if o.status == "SUCCESS"}
        for problem in footprint.violations(platform.data_root, training_ranks, succeeded_roots):
            checker.violation("footprint", problem)
        checker.checks["footprint"] += len(footprint.samples)
        for run_id in stuck:
            checker.violation("runs", f"run {run_id} still queued or running {drain_s:.0f} s after the load stopped")
        fault_instance.dispose()
        checker.instance.dispose()
        return _record(settings, launcher, minutes, started_at, clock, load_ended, drain_s, classes, commits,
                       retrains, reader, footprint, scheduler, checker, platform)


def stack_instance(platform: SoakPlatform) -> dg.DagsterInstance:
    """An instance of the soak's own for a thread (SQLite connections are not shared across threads)."""
    return dg.DagsterInstance.from_config(str(platform.home))


def _percentile(values: list[float], q: int) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100)[q - 1]


def _record(settings, launcher, minutes, started_at, clock, load_ended, drain_s, classes, commits, retrains,
            reader, footprint, scheduler, checker, platform) -> dict:
    faults = [f.to_dict() for f in scheduler.faults]
    by_class = {cls: {"label": label, "injected": sum(f["injected"] for f in faults if f["cls"] == cls),
                      "not_injected": sum(not f["injected"] and not f["cut_short"] for f in faults if f["cls"] == cls),
                      "cut_short": sum(f["cut_short"] for f in faults if f["cls"] == cls)}
                for cls, label in classes.items()}
    for fault in scheduler.faults:
        if fault.error:
            checker.violation("soak", f"the {fault.cls} injector failed: {fault.error[-500:]}")
        if fault.violation:
            checker.violation("runs", f"{fault.cls}: {fault.violation}")
    outcomes = [o.to_dict() for o in checker.outcomes.values()]
    runs_by_model: dict = {}
    for o in outcomes:
        runs_by_model.setdefault(o["model"] or "(none)", Counter())[o["verdict"]] += 1
    counts = list(checker.message_counts.values())
    violations = [v.to_dict() for v in checker.violations]
    per_invariant = {name: {"description": text, "checks": checker.checks.get(name, 0),
                            "violations": sum(v["invariant"] == name for v in violations)}
                     for name, text in INVARIANTS.items()}
    lat = sorted(reader.latencies_s)
    return {
        "launcher": launcher,
        "seed": settings.seed,
        "replay": f"SOAK_SEED={settings.seed} SOAK_MINUTES={settings.minutes:g} SOAK_K8S_MINUTES={settings.k8s_minutes:g}"
                  + (f" SOAK_CLASSES={','.join(settings.classes)}" if settings.classes else ""),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started_at)),
        "machine": f"{host.machine()}, {os.cpu_count()} CPUs, Python {host.python_version()}",
        "minutes_of_load": minutes,
        "fault_gap_s": list(settings.gap_for(minutes)),
        "load_s": load_ended,
        "drain_s": round(drain_s, 1),
        "duration_s": clock.now(),
        "commits": {"ok": sum(c["ok"] for c in commits.records), "failed": sum(not c["ok"] for c in commits.records),
                    "errors": [c["error"] for c in commits.records if not c["ok"]][:10]},
        "retrain_submissions": {"ok": sum("run_id" in r for r in retrains.records),
                                "refused": [r["error"] for r in retrains.records if "error" in r][:10]},
        "runs": {"total": len(outcomes), "by_model": {m: dict(c) for m, c in sorted(runs_by_model.items())},
                 "outcomes": outcomes},
        "versions": _versions(checker),
        "graphql": {"requests": len(lat) + len(reader.errors), "errors": len(reader.errors),
                    "first_errors": reader.errors[:10],
                    "p50_ms": _ms(_percentile(lat, 50)), "p95_ms": _ms(_percentile(lat, 95)),
                    "max_ms": _ms(lat[-1] if lat else None)},
        "faults": faults,
        "faults_by_class": by_class,
        "classes_not_injected": sorted(cls for cls, c in by_class.items() if not c["injected"]),
        "invariant_rounds": checker.rounds,
        "invariants": per_invariant,
        "violations": violations,
        "pipes": {"runs": len(counts), "written": sum(c.written for c in counts),
                  "required": sum(c.required for c in counts), "checked": sum(c.checked for c in counts),
                  "covered": sum(c.covered for c in counts), "unverifiable": sum(c.unverifiable for c in counts),
                  "thinned": sum(c.thinned for c in counts),
                  "missing": sum(len(c.missing) for c in counts),
                  "skipped_lines": [line for c in counts for line in c.skipped_lines][:10]},
        "leftover_temporaries": len(leftover_temporaries(platform.data_root)),
        "footprint": footprint.samples,
    }


def _versions(checker: Checker) -> dict[str, int]:
    versions: Counter = Counter()
    for model, _ in checker._versions_done:  # noqa: SLF001 - the checker's own record of what it checked
        versions[model] += 1
    return dict(sorted(versions.items()))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000)
