"""The benchmark harness: ``python -m benchmarks.run [--size tiny|full] [--only NAME]``.

Runs every row of the table in one run (loaders, images, tokens, ingest, checkpoints, scaling,
guards, FSDP memory, pipeline overhead, launch latency, retrain on unchanged data, sweeps), each
as a ratio measured side by side in this run where it can be (repetitions interleaved, medians
reported; a row measured alone says so in its last column), and writes ``results.json`` and the
results table of ``BENCHMARKS.md`` (between its markers; the notes around the table are kept).
``--only NAME`` re-runs rows on their own and keeps the other entries of results.json; such rows
are marked as re-run. Every measurement runs in its own subprocess; the peers run in
``benchmarks/.peers-venv`` (created by ``benchmarks/peers_setup.sh`` when missing, unless
``--no-peers``). The rows live in the ``*_rows`` modules, one per concern.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks import data_rows, image_rows, loader_rows, pipeline_rows, stream_rows, training_rows
from benchmarks.common import BENCH, DATA, REPO, load_average, machine
from benchmarks.harness import SIZES, Ctx, Rows, ensure_peers

MODULES = (loader_rows, image_rows, data_rows, stream_rows, training_rows, pipeline_rows)
RUNNERS = {name: fn for m in MODULES for name, fn in m.RUNNERS.items()}  # the default run, in the table's order
EXTRA = dict(loader_rows.EXTRA)  # only when named with --only
RENDER = {name: m.render for m in MODULES for name in (*m.RUNNERS, *getattr(m, "EXTRA", {}))}
BENCHMARKS = tuple(RUNNERS)
NEEDS_PEERS = ("loaders", "image_loader")
MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"


def table(results: dict) -> str:
    b = results["benchmarks"]
    rows = Rows()
    for name in [*RUNNERS, *EXTRA, *(n for n in b if n not in RENDER)]:
        entry = b.get(name)
        if entry is None:
            continue
        if "error" in entry:
            rows.add(name, "not measured", entry["error"][-200:], "—", None, how="—")
            continue
        if name not in RENDER:  # an entry of an older harness, kept in results.json
            continue
        start = len(rows)
        RENDER[name]({name: entry}, rows)
        if "rerun" in entry:
            r = entry["rerun"]
            how = f"re-run alone: `{r['command']}` at {r['date']} (load after {r['load_after']})"
            rows[start:] = [dataclasses.replace(row, how=how) for row in rows[start:]]
    head = ["| figure | measured | behind it | target | | how measured |",
            "| --- | --- | --- | --- | --- | --- |"]
    m = results["machine"]
    meta = [f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, "
            f"Linux {m['kernel']}. Date: {results['date']}. Command: `{results['command']}` "
            f"(size {results['size']}, {results['wall_s'] / 60:.1f} min). Load average (1/5/15 min) before "
            f"{results['load_before']}, after {results['load_after']}: the cores were shared with other "
            "work, so absolute figures are noisy; each ratio compares runs made side by side in this run "
            "unless its last column says otherwise."]
    return "\n".join(meta + [""] + head + [row.markdown() for row in rows])


def write_report(results: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    md = out / "BENCHMARKS.md" if out != BENCH else REPO / "BENCHMARKS.md"
    block = f"{MARK_BEGIN}\n{table(results)}\n{MARK_END}"
    if md.exists() and MARK_BEGIN in md.read_text():
        text = md.read_text()
        pre, rest = text.split(MARK_BEGIN, 1)
        text = pre + block + rest.split(MARK_END, 1)[1]
    else:
        text = f"# Benchmarks\n\n{block}\n"
    md.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--only", choices=BENCHMARKS + tuple(EXTRA), action="append",
                    help="run only this row (repeatable); other entries of results.json are kept")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers' venv and the peer loaders")
    ap.add_argument("--out", type=Path, default=BENCH,
                    help="where results.json goes (default benchmarks/; BENCHMARKS.md then goes to the repo root)")
    ap.add_argument("--data-dir", type=Path, default=DATA, help="generated data (default benchmarks/data)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    a.data_dir.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(a.size, a.data_dir.resolve(), peers=not a.no_peers)
    names = a.only or list(BENCHMARKS)
    prev = a.out / "results.json"
    results = json.loads(prev.read_text()) if a.only and prev.exists() else {"benchmarks": {}}
    t0 = time.perf_counter()
    command = " ".join(["python -m benchmarks.run", *(sys.argv[1:] if argv is None else argv)])
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rerun = bool(a.only) and "command" in results
    if not rerun:
        results.update(machine=machine(), date=date, command=command, size=a.size, load_before=load_average())
    if any(n in names for n in NEEDS_PEERS):
        ensure_peers(ctx)
    runners = {**RUNNERS, **EXTRA}
    for name in names:
        t = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        try:
            results["benchmarks"][name] = {**runners[name](ctx), "bench_wall_s": time.perf_counter() - t}
            if rerun:
                results["benchmarks"][name]["rerun"] = {"command": command, "date": date, "load_after": load_average()}
        except Exception as e:  # recorded as not measured, with the reason; the other rows go on
            traceback.print_exc()
            results["benchmarks"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"[bench] {name} done in {time.perf_counter() - t:.0f} s", flush=True)
        if not rerun:
            results.update(load_after=load_average(), wall_s=time.perf_counter() - t0)
        write_report(results, a.out)
    print(table(results))
    return 0 if all("error" not in results["benchmarks"][n] for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
