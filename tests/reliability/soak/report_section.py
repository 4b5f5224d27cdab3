"""RELIABILITY.md's soak section, rendered from the soak's JSON (test_soak.py writes it;
tests/reliability/report.py appends this section, or replaces it after a soak run alone)."""

from __future__ import annotations

HEADING = "## The soak"
TITLES = {"local": "Local platform (torchrun workers)", "kubernetes": "Kubernetes path (pod simulation)"}
FOOTPRINT_ROWS = 10
INVARIANT_ORDER = ("lineage", "weights", "main", "listed", "runs", "pipes", "services", "footprint")
REPLAY = ".venv/bin/python -m pytest tests/reliability/soak/test_soak.py -m heavy"
# The section's table rows start "|x", never "| ": report.py's splice() takes every line that
# starts "| " for a row of the classes table it re-sorts.


def soak_section(soak: dict, command: str = "make reliability") -> str:
    lines = [HEADING, "",
             f"Written from the soak's record by `{command}`: pipelines retrain over and over on a real "
             "webserver and daemon while faults of every class above arrive at random; the invariants are checked "
             "every minute and once more after the runs in flight have drained. docs/reliability.md (\"The soak\") "
             "says what each part does and how to replay a seed.", ""]
    for key in ("local", "kubernetes"):
        if key in soak:
            lines += _part(TITLES[key], soak[key])
    if not any(k in soak for k in TITLES):
        lines += ["No soak ran.", ""]
    return "\n".join(lines)


def _part(title: str, r: dict) -> list[str]:
    runs, g, p = r["runs"], r["graphql"], r["pipes"]
    injected = sum(c["injected"] for c in r["faults_by_class"].values())
    missed = sum(c["not_injected"] for c in r["faults_by_class"].values())
    cut = sum(c.get("cut_short", 0) for c in r["faults_by_class"].values())
    absent = [cls for cls, c in sorted(r["faults_by_class"].items()) if not c["injected"]]
    verdicts: dict[str, int] = {}
    for counts in runs["by_model"].values():
        for verdict, n in counts.items():
            verdicts[verdict] = verdicts.get(verdict, 0) + n
    lines = [
        f"### {title}", "",
        f"- **Ran** {r['started']} on {r['machine']}: {r['load_s'] / 60:.1f} min of load and faults "
        f"(planned {r['minutes_of_load']:g}; the fault under way when the time is up runs to its end), then "
        f"{r['drain_s'] / 60:.1f} min draining the runs in flight.",
        f"- **Seed** {r['seed']}; replay the soak alone with `{r['replay']} {REPLAY}` (the same classes in the "
        "same order, with the same gaps and settings, unless a draw finds nothing to hit; which run each fault "
        "lands in depends on timing).",
        f"- **Load:** {runs['total']} runs ({_counts(verdicts)}); versions registered: {_counts(r['versions'])}; "
        f"{r['commits']['ok']} new-data commits of digits ({r['commits']['failed']} refused during store faults); "
        f"GraphQL reader: {g['requests']} requests, {g['errors']} errors, p50 {g['p50_ms']} ms, p95 {g['p95_ms']} ms.",
        f"- **Faults:** {injected} injected, of {len(r['faults_by_class'])} classes "
        + (f"(**not injected: {', '.join(absent)}**)" if absent else "(every class at least once)")
        + f", each {r['fault_gap_s'][0]:g}-{r['fault_gap_s'][1]:g} s after the last one ended; draws that found "
        f"nothing to hit (drawn again): {missed}; cut short by the end of the load: {cut}.",
        f"- **Invariant checks:** {r['invariant_rounds']} rounds; **violations: {len(r['violations'])}**.",
        f"- **Pipes messages:** {p['written']} written by rank 0 in {p['runs']} runs; {p['checked']} matched one by "
        f"one in the event logs, {p['covered']} (validation, final) followed by one that arrived, "
        f"{p['unverifiable']} unverifiable (last before a kill), {p.get('thinned', 0)} telemetry thinned on purpose "
        f"(a long training's), {p['written'] - p['required'] - p.get('thinned', 0)} "
        f"written after their run worker was killed; **{p['missing']} missing**.",
        *_elastic(r.get("faults", [])),
        "",
        "|fault | class in the table above | injected | found nothing to hit |",
        "|--- | --- | ---: | ---: |",
    ]
    for cls, c in sorted(r["faults_by_class"].items()):
        lines.append(f"|{cls} | {c['label']} | {c['injected']} | {c['not_injected']} |")
    lines += ["", "|invariant | checks | violations |", "|--- | ---: | ---: |"]
    for name in sorted(r["invariants"], key=lambda n: INVARIANT_ORDER.index(n) if n in INVARIANT_ORDER else 99):
        inv = r["invariants"][name]
        lines.append(f"|{inv['description']} | {inv['checks']} | {inv['violations']} |")
    if r["violations"]:
        lines += ["", "Violations:", ""]
        lines += [f"- {v['invariant']} at {v['at'] / 60:.1f} min: {_cell(v['detail'])}" for v in r["violations"][:30]]
    lines += ["", "Footprint (every process of the platform, and the disk its state takes; the daemon starts a "
              "fresh code server per location about once a minute and lets the old one expire, Dagster's own "
              "workspace reload, so the long-lived figure swings by a code server or two):", "",
              "|min | processes | memory MB | webserver + daemon (long-lived) MB | disk MB |",
              "|---: | ---: | ---: | ---: | ---: |"]
    for s in _spread(r["footprint"], FOOTPRINT_ROWS):
        lines.append(f"|{s['at'] / 60:.1f} | {s['processes']} | {s['rss_mb_total']:.0f} | "
                     f"{s['long_lived_rss_mb']:.0f} | {s['disk_mb_total']:.0f} |")
    lines.append("")
    return lines


def _elastic(faults: list[dict]) -> list[str]:
    """A line on the elastic gangs' node losses (faults.py ELASTIC_CLASSES), when any was judged."""
    judged = [f for f in faults if f["cls"].startswith("elastic_") and "run_status" in f.get("target", {})]
    if not judged:
        return []
    went_on = [f for f in judged if f["target"]["run_status"] == "SUCCESS" and f["target"]["world_sizes"]]
    grew = sum(bool(f["target"]["grew_back"]) for f in judged)
    sizes = "; ".join(f"{f['cls']} {f['target']['world_sizes']}" for f in went_on)
    return [f"- **Elastic gangs** (digits on 1-2 pods): {len(judged)} node losses judged; the gang went on and its "
            f"run succeeded after {len(went_on)}, grew back to its size after {grew}"
            + (f"; world sizes of the hit trainings' attempts: {sizes}" if sizes else "") + "."]


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _cell(text: str) -> str:
    return " ".join(str(text).split())[:400]


def _spread(samples: list[dict], n: int) -> list[dict]:
    """``n`` samples evenly spread over the soak, first and last included."""
    if len(samples) <= n:
        return samples
    step = (len(samples) - 1) / (n - 1)
    return [samples[round(i * step)] for i in range(n)]


def splice_soak(report: str, section: str) -> str:
    """``report`` with its soak section replaced by ``section`` (appended when it has none)."""
    head, found, _ = report.partition(HEADING)
    return (head.rstrip("\n") + "\n\n" if found else report.rstrip("\n") + "\n\n") + section
