"""The whole-platform rows of the benchmark table (figures 6 and 9): the pipeline against a plain
script, launch → first step, a retrain on unchanged data against the first run, and sweeps (a
sweep against its trainings one after another; its orchestrating process's memory as trials add
up). The pipeline runs in benchmarks/pipeline_job.py, the sweeps in benchmarks/sweep_bench.py.
``RUNNERS`` measure; ``render`` turns results.json's entries into rows."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from benchmarks.common import run_json
from benchmarks.harness import Ctx, Rows, fmt, measured
from benchmarks.pipeline_job import DATA_ASSETS, PIPELINE


# ---------------------------------------------------------------- 6. platform overhead
def _pipeline_run(ctx: Ctx, src: Path, epochs: int, home: str) -> dict:
    """One run of the whole local pipeline in a fresh process, in the Dagster home ``home``."""
    launched = time.time()
    t0 = time.perf_counter()
    r = run_json([ctx.py, "-m", "benchmarks.pipeline_job", "--source", str(src), "--dim", "256",
                  "--epochs", str(epochs), "--launched-at", str(launched)],
                 timeout=ctx.p["timeout"] * 2, env={"DAGSTER_HOME": home, "PLATFORM_PROFILE": "local"})
    first = r["first_step_at"]
    return {"wall_s": time.perf_counter() - t0, **r,
            "launch_to_first_step_s": None if first is None else first - launched,
            "execute_to_first_step_s": None if first is None else first - r["execute_at"]}


def _dagster_home(ctx: Ctx):
    home = tempfile.TemporaryDirectory(dir=ctx.data, prefix="dagster-home-")
    Path(home.name, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return home


def _overhead_source(ctx: Ctx) -> Path:
    from benchmarks import datagen

    return datagen.csv_source(ctx.data / "csv" / f"overhead_{ctx.size}.csv", rows=ctx.p["over_rows"], dim=256)


def bench_overhead(ctx: Ctx) -> dict:
    p = ctx.p
    src = _overhead_source(ctx)
    plain = [ctx.py, "-m", "benchmarks.plain_pipeline", "--source", str(src), "--dim", "256"]
    calib = run_json(plain + ["--epochs", "1"], timeout=p["timeout"])
    epochs = max(1, math.ceil(p["over_target_s"] / calib["train_s"]))
    t0 = time.perf_counter()
    plain_r = run_json(plain + ["--epochs", str(epochs)], timeout=p["timeout"])
    plain_wall = time.perf_counter() - t0
    with _dagster_home(ctx) as home:
        plat = _pipeline_run(ctx, src, epochs, home)
    return {"rows": p["over_rows"], "source_bytes": src.stat().st_size, "epochs": epochs,
            "plain": {"wall_s": plain_wall, **plain_r}, "platform": plat,
            "platform_vs_plain": plat["wall_s"] / plain_wall,
            "launch_to_first_step_s": plat["launch_to_first_step_s"],
            "execute_to_first_step_s": plat["execute_to_first_step_s"],
            "note": "run once (each side takes minutes); not interleaved"}


# ---------------------------------------------------------------- 6d. retrain on unchanged data
def bench_retrain(ctx: Ctx) -> dict:
    """The same pipeline run twice in one Dagster home on the same source: the second run's data
    key equals the first's, so it should reuse the first run's dataset version (assets/reuse.py)
    and neither ingest nor shard."""
    src = _overhead_source(ctx)
    with _dagster_home(ctx) as home:
        first = _pipeline_run(ctx, src, ctx.p["retrain_epochs"], home)
        second = _pipeline_run(ctx, src, ctx.p["retrain_epochs"], home)

    def data_s(r: dict) -> float:
        return sum(r["step_seconds"].get(f"{PIPELINE}__{k}", 0.0) for k in DATA_ASSETS)
    reused = {k: second["data_assets"].get(k, {}).get("reused_dataset_version") for k in DATA_ASSETS}
    same_commit = (second["data_assets"].get("shards", {}).get("commit_id")
                   == first["data_assets"].get("shards", {}).get("commit_id"))
    return {"rows": ctx.p["over_rows"], "source_bytes": src.stat().st_size, "epochs": ctx.p["retrain_epochs"],
            "first": first, "second": second, "second_vs_first": second["wall_s"] / first["wall_s"],
            "data_steps_s": {"first": data_s(first), "second": data_s(second)},
            "first_reused": {k: first["data_assets"].get(k, {}).get("reused_dataset_version") for k in DATA_ASSETS},
            "reused_dataset_version": reused, "same_shards_commit": same_commit,
            "reused": all(reused.values()) and same_commit}


# ---------------------------------------------------------------- 9. sweeps
def bench_sweep(ctx: Ctx) -> dict:
    p = ctx.p
    return run_json([ctx.py, "-m", "benchmarks.sweep_bench", "speed", "--trials", str(p["sweep_trials"]),
                     "--parallelism", "2", "--steps", str(p["sweep_steps"]), "--rows", str(p["sweep_rows"])],
                    timeout=p["timeout"] * 2)


def bench_sweep_memory(ctx: Ctx) -> dict:
    p = ctx.p
    return run_json([ctx.py, "-m", "benchmarks.sweep_bench", "memory", "--counts",
                     *map(str, p["sweep_memory_trials"]), "--parallelism", "2", "--steps",
                     str(p["sweep_memory_steps"]), "--rows", str(p["sweep_rows"])], timeout=p["timeout"] * 2)


# ---------------------------------------------------------------- rows
def render(b: dict, rows: Rows) -> None:
    """Rows 6, 6b, 6c, 6d, 9a and 9b of ``b`` (results.json's ``benchmarks``)."""
    if measured(b.get("overhead")):
        _overhead_rows(b["overhead"], rows)
    if measured(b.get("retrain")):
        s = b["retrain"]
        d, first, second = s["data_steps_s"], s["first"], s["second"]
        rows.add(f"6d. retrain on unchanged data ({s['source_bytes'] / 2**20:.0f} MB CSV, {s['epochs']} epoch), "
                 "against the first run", f"{fmt(s['second_vs_first'])}× the first run's time; reused: "
                 + ("yes" if s["reused"] else "no"),
                 f"first {first['wall_s']:.1f} s, second {second['wall_s']:.1f} s; raw_dataset + shards "
                 f"{d['first']:.1f} s then {d['second']:.1f} s; reused_dataset_version: "
                 + ", ".join(f"{k} {v}" for k, v in s["reused_dataset_version"].items())
                 + f"; same shards commit: {s['same_shards_commit']}",
                 "reuses the version (ingest and sharding skipped); faster than the first",
                 s["reused"] and s["second_vs_first"] < 1.0, how="once, in order (the second needs the first's version)")
    if measured(b.get("sweep")):
        s = b["sweep"]
        rows.add(f"9a. sweep, {s['trials']} trials {s['parallelism']} at a time ({s['steps_per_trial']} steps each, "
                 "torchrun, 1 gloo rank), against the same trainings one after another",
                 f"{fmt(s['speedup'])}× faster", f"sweep {s['sweep_wall_s']:.1f} s; one after another "
                 f"{s['sequential_wall_s']:.1f} s; each trial's best loss equals its twin's: {s['same_values']}",
                 f"≥ 1.8× ({s['parallelism']} at a time on {s['cpus']} cores)", s["speedup"] >= 1.8,
                 how="once each, in turn")
    if measured(b.get("sweep_memory")):
        s = b["sweep_memory"]
        at, counts = s["at"], [str(c) for c in s["counts"]]
        rows.add(f"9b. sweep orchestrator memory, trials finished {' → '.join(counts)} (one sweep, "
                 f"{s['parallelism']} at a time, {s['steps_per_trial']} steps each)",
                 f"peak RSS {fmt(s['peak_rss_growth'])}× from {counts[0]} to {counts[-1]} trials",
                 "peak RSS MB of the sweep's own process: " + "/".join(f"{at[c]['peak_rss_bytes'] / 2**20:.0f}"
                                                                       for c in counts)
                 + f" (at start {s['start_rss_bytes'] / 2**20:.0f}); s: " + "/".join(f"{at[c]['wall_s']:.0f}"
                                                                                    for c in counts),
                 "≤ 1.25× (flat)", s["peak_rss_growth"] <= 1.25, how="one sweep, read as it goes")


def _overhead_rows(s: dict, rows: Rows) -> None:
    alone = "once (each side takes minutes)"
    rows.add(f"6. platform overhead ({s['epochs']} epochs, {s['source_bytes'] / 2**20:.0f} MB CSV)",
             f"{fmt(s['platform_vs_plain'])}× plain script",
             f"pipeline {s['platform']['wall_s']:.1f} s; plain {s['plain']['wall_s']:.1f} s (its training "
             f"{s['plain']['train_s']:.1f} s)", "≤ 1.05×", s["platform_vs_plain"] <= 1.05, how=alone)
    first = s["launch_to_first_step_s"]
    rows.add("6b. run launch → first training step", f"{fmt(first, '{:.1f}')} s",
             f"from job execution start {fmt(s['execute_to_first_step_s'], '{:.1f}')} s; step times "
             + ", ".join(f"{k.split('__')[-1]} {v:.1f} s" for k, v in s["platform"]["step_seconds"].items()),
             "≤ 5 s", None if first is None else first <= 5.0, how=alone)
    tf = s["platform"].get("training_figures") or {}
    if tf.get("samples_per_second"):
        loop = tf["steps"] * 256 / tf["samples_per_second"]  # the recipe's global batch
        # the checkpoint asset's steps (the training op and its health check)
        step = sum(v for k, v in s["platform"]["step_seconds"].items() if k.startswith(f"{PIPELINE}__checkpoint"))
        rows.add("6c. inside the platform's training step", f"training loop {loop:.1f} s; checkpoint stalls "
                 f"{tf.get('checkpoint_stall_s_total', float('nan')):.1f} s",
                 f"checkpoint steps {step:.1f} s "
                 f"in all; plain script's training loop {s['plain']['train_s']:.1f} s; data wait share "
                 f"{tf.get('data_wait_share', float('nan')):.3f}", "(reported)", None, how=alone)


RUNNERS = {"overhead": bench_overhead, "retrain": bench_retrain, "sweep": bench_sweep,
           "sweep_memory": bench_sweep_memory}
