"""A sweep's wall time against the same trainings one after another, side by side in one run.

``python -m benchmarks.sweep_bench`` (part of ``make bench``): N trials of the real runtime
(``torchrun``, one gloo rank each, validations every few steps) with parameters Optuna's random
sampler proposes, run by the platform's sweep loop (ops/sweep_trials.py) ``parallelism`` at a
time, then the very same N parameter sets trained sequentially. No pruning, so both do the same
work; the ratio is what running trials side by side buys on this machine. The result replaces the
"Sweep" section of BENCHMARKS.md and is kept in benchmarks/sweep_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

from benchmarks import datagen, training
from benchmarks.common import REPO

SECTION = "## Sweep: parallel trials against sequential trainings"


def trial_config(data: Path, manifest: dict, work: Path, params: dict, steps: int) -> dict:
    cfg = training.runtime_config(data, manifest, work, global_batch=256, max_steps=steps)
    cfg["model"] = {"name": "mlp", "kwargs": {"hidden_sizes": params["model.hidden_sizes"]}}
    cfg["train"]["lr"] = params["train.lr"]
    cfg["validation"] = {"every_steps": max(1, steps // 5), "metric": "loss", "mode": "min"}
    return cfg


def main(argv: list[str] | None = None) -> int:
    from core.sweep import Choice, LogRange, Sweep
    from ops.sweep_trials import SweepRunner, open_study

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "sweep_results.json"))
    ap.add_argument("--no-markdown", action="store_true", help="Do not rewrite BENCHMARKS.md.")
    args = ap.parse_args(argv)

    sweep = Sweep(space={"train.lr": LogRange(1e-4, 1e-2), "model.hidden_sizes": Choice([512, 512], [1024, 512])},
                  objective="loss", trials=args.trials, parallelism=args.parallelism, sampler="random",
                  pruner="none", seed=0)
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        root = Path(tmp)
        data = root / "data"
        manifest = datagen.shard_dataset(data, rows=args.rows, dim=256, samples_per_shard=4096)

        def launch(plan) -> dict:
            cfg = trial_config(data, manifest, plan.folder / "run", plan.params, args.steps)
            cfg["validation"]["report_file"] = str(plan.report_file)
            cfg["validation"]["stop_file"] = str(plan.stop_file)
            return training.torchrun(cfg, plan.folder / "run", 1, timeout=1800)

        study = open_study(f"sqlite:///{root / 'optuna.sqlite'}", "bench", sweep, "minimize")
        t0 = time.perf_counter()
        result = SweepRunner(sweep, study, objective="loss", trial_root=root / "trials", launch=launch,
                             log=print).run()
        sweep_s = time.perf_counter() - t0
        assert all(r.state == "complete" for r in result.records), [r.to_dict() for r in result.records]

        t0 = time.perf_counter()
        sequential = []
        for r in result.records:  # the same parameters, one training after another
            m = training.torchrun(trial_config(data, manifest, root / "seq" / str(r.number), r.params, args.steps),
                                  root / "seq" / str(r.number), 1, timeout=1800)
            sequential.append(m["best_value"])
        sequential_s = time.perf_counter() - t0

    figures = {"trials": args.trials, "parallelism": args.parallelism, "steps_per_trial": args.steps,
               "sweep_wall_s": round(sweep_s, 1), "sequential_wall_s": round(sequential_s, 1),
               "speedup": round(sequential_s / sweep_s, 2), "cpus": os.cpu_count(),
               "best_trial": result.best.number, "best_value": result.best.value,
               "same_values": all(abs(a - b) < 1e-6 for a, b in
                                  zip([r.value for r in result.records], sequential)),
               "command": "python -m benchmarks.sweep_bench " + " ".join(argv or [])}
    Path(args.out).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))
    if not args.no_markdown:
        write_section(REPO / "BENCHMARKS.md", figures)
    return 0


def write_section(path: Path, f: dict) -> None:
    text = (f"{SECTION}\n\n"
            f"`{f['command'].strip()}` ({f['cpus']} CPUs): {f['trials']} trials of the real runtime (torchrun, one "
            f"gloo rank each, {f['steps_per_trial']} steps, an MLP on 256 features), parameters from Optuna's random "
            f"sampler, no pruning.\n\n"
            f"| Run | Wall time | Ratio |\n| --- | --- | --- |\n"
            f"| sweep, {f['parallelism']} trials at a time | {f['sweep_wall_s']} s | {f['speedup']}x |\n"
            f"| the same {f['trials']} trainings one after another | {f['sequential_wall_s']} s | 1.00x |\n\n"
            f"Each trial's best validation loss equals its sequential twin's: {f['same_values']}.\n")
    old = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(SECTION) + r".*?(?=\n## |\Z)", re.S)
    new = pattern.sub(text.rstrip("\n") + "\n", old) if SECTION in old else old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


if __name__ == "__main__":
    raise SystemExit(main())
