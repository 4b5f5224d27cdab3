"""Sweeps of real trainings, measured in a process of their own: ``python -m benchmarks.sweep_bench
speed|memory ...`` prints one JSON line (rows 9a and 9b of the table, benchmarks/pipeline_rows.py).

Each trial is the real runtime (``torchrun``, one gloo rank, validations every few steps) with
parameters Optuna's random sampler proposes, run by the platform's sweep loop
(ops/sweep_trials.py) ``parallelism`` at a time; no pruning, so every trial does the same work.

- ``speed``: the sweep, then the very same parameter sets trained one after another; the ratio
  is what running trials side by side buys on this machine.
- ``memory``: one sweep of the largest count in ``--counts``; this process (the sweep's
  orchestrator: Optuna's study in SQLite, the trial threads, the validation reports it reads)
  samples its own RSS, and the peak so far is read each time the number of finished trials
  reaches a count. The trainings run in their own processes and are not counted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks import datagen, training
from benchmarks.common import PeakMemory, ProbeError, emit


def trial_config(data: Path, manifest: dict, work: Path, params: dict, steps: int) -> dict:
    cfg = training.runtime_config(data, manifest, work, global_batch=256, max_steps=steps)
    cfg["model"] = {"name": "mlp", "kwargs": {"hidden_sizes": params["model.hidden_sizes"]}}
    cfg["train"]["lr"] = params["train.lr"]
    cfg["validation"] = {"every_steps": max(1, steps // 5), "metric": "loss", "mode": "min"}
    return cfg


def _sweep(trials: int, parallelism: int):
    from core.sweep import Choice, LogRange, Sweep

    return Sweep(space={"train.lr": LogRange(1e-4, 1e-2), "model.hidden_sizes": Choice([512, 512], [1024, 512])},
                 objective="loss", trials=trials, parallelism=parallelism, sampler="random", pruner="none", seed=0)


def _run_sweep(root: Path, trials: int, parallelism: int, steps: int, data: Path, manifest: dict,
               on_change=None):
    """The platform's sweep loop over real trainings; every trial must complete."""
    from ops.sweep_trials import COMPLETE, SweepRunner, open_study

    sweep = _sweep(trials, parallelism)

    def launch(plan) -> dict:
        cfg = trial_config(data, manifest, plan.folder / "run", plan.params, steps)
        cfg["validation"]["report_file"] = str(plan.report_file)
        cfg["validation"]["stop_file"] = str(plan.stop_file)
        return training.torchrun(cfg, plan.folder / "run", 1, timeout=1800)

    study = open_study(f"sqlite:///{root / 'optuna.sqlite'}", "bench", sweep, "minimize")
    result = SweepRunner(sweep, study, objective="loss", trial_root=root / "trials", launch=launch,
                         log=lambda line: None, on_change=on_change).run()
    failed = [r.to_dict() for r in result.records if r.state != COMPLETE]
    if failed:
        raise ProbeError(f"{len(failed)} of {trials} sweep trials did not complete: {failed}")
    return result


def speed(trials: int, parallelism: int, steps: int, rows: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        root = Path(tmp)
        data = root / "data"
        manifest = datagen.shard_dataset(data, rows=rows, dim=256, samples_per_shard=4096)
        t0 = time.perf_counter()
        result = _run_sweep(root, trials, parallelism, steps, data, manifest)
        sweep_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        sequential = []
        for r in result.records:  # the same parameters, one training after another
            m = training.torchrun(trial_config(data, manifest, root / "seq" / str(r.number), r.params, steps),
                                  root / "seq" / str(r.number), 1, timeout=1800)
            sequential.append(m["best_value"])
        sequential_s = time.perf_counter() - t0
    return {"trials": trials, "parallelism": parallelism, "steps_per_trial": steps, "rows": rows,
            "sweep_wall_s": sweep_s, "sequential_wall_s": sequential_s, "speedup": sequential_s / sweep_s,
            "cpus": os.cpu_count(), "best_trial": result.best.number, "best_value": result.best.value,
            "same_values": all(abs(a - b) < 1e-6 for a, b in zip([r.value for r in result.records], sequential))}


def memory(counts: list[int], parallelism: int, steps: int, rows: int) -> dict:
    finished_states = {"complete", "pruned", "failed"}
    at: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sweep-memory-") as tmp:
        root = Path(tmp)
        data = root / "data"
        manifest = datagen.shard_dataset(data, rows=rows, dim=256, samples_per_shard=4096)
        with PeakMemory(interval=0.05) as mem:
            t0 = time.perf_counter()

            def on_change(records) -> None:
                done = sum(r.state in finished_states for r in records)
                for c in counts:
                    if done >= c and str(c) not in at:
                        at[str(c)] = {"peak_rss_bytes": mem.peak_rss, "rss_bytes": mem.read()[0],
                                      "peak_anon_bytes": mem.peak_anon, "wall_s": time.perf_counter() - t0}
            _run_sweep(root, max(counts), parallelism, steps, data, manifest, on_change=on_change)
        missing = [c for c in counts if str(c) not in at]
        if missing:
            raise ProbeError(f"the sweep never reported {missing} finished trials")
    first, last = at[str(counts[0])], at[str(counts[-1])]
    return {"counts": counts, "parallelism": parallelism, "steps_per_trial": steps, "rows": rows,
            "start_rss_bytes": mem.start_rss, "at": at,
            "peak_rss_growth": last["peak_rss_bytes"] / first["peak_rss_bytes"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sweep_bench", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("speed", help="a sweep against the same trainings one after another")
    s.add_argument("--trials", type=int, default=8)
    m = sub.add_parser("memory", help="the orchestrating process's peak RSS as trials finish")
    m.add_argument("--counts", type=int, nargs="+", default=[4, 8, 16, 32],
                   help="finished-trial counts at which the peak is read (ascending; the sweep runs the last)")
    for p in (s, m):
        p.add_argument("--parallelism", type=int, default=2)
        p.add_argument("--steps", type=int, default=60)
        p.add_argument("--rows", type=int, default=20000)
    a = ap.parse_args(argv)
    if a.what == "speed":
        emit(speed(a.trials, a.parallelism, a.steps, a.rows))
    else:
        if a.counts != sorted(a.counts):
            ap.error(f"--counts must be ascending, got {a.counts}")
        emit(memory(a.counts, a.parallelism, a.steps, a.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
