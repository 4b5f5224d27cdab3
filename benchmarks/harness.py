"""What every row of the benchmark table shares: the sizes, the run's context (where data goes,
which Python runs the probes), the peers' environment, and the rows' cells. The rows themselves
live in the ``*_rows`` modules, one per concern; benchmarks/run.py runs them and writes the table."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BENCH, PEERS_VENV, VENV_PY, run_json

SIZES = {
    "tiny": {"reps": 1, "loader_seconds": 0.4, "rows_4k": 1100, "rows_192k": 120, "stall_seconds": 0.5,
             "pre_rows": 2000, "pre_dim": 64, "ckpt_hidden": 256, "ckpt_reps": 1, "scale_steps": 4,
             "guards_steps": 4, "guards_reps": 1, "guard_step_steps": 3,
             "scale_rows": 1200, "over_rows": 1500, "over_target_s": 1.0, "growth_rows": 300,
             "growth_samples": 512, "limit_mb": 64, "chunk_mb": 0.5, "timeout": 300,
             "images": 1024, "token_windows": 16384, "typed_seconds": 1.5, "typed_reps": 3,
             "image_folder": 192,
             "sweep_trials": 2, "sweep_steps": 6, "sweep_rows": 1200,
             "sweep_memory_trials": [2, 4], "sweep_memory_steps": 2,
             "retrain_epochs": 1,
             # too small for the size-based units (at least 2**20 parameters each): its blocks by class name
             "fsdp": {"d_model": 64, "layers": 4, "vocab": 256, "heads": 4, "batch": 2, "seq": 32, "steps": 1,
                      "units": "UserBlock"},
             # 5e through python -m pipelines train: a team's transformer, two blocks of width 64
             "fsdp_train": {"d_model": 64, "layers": 2, "heads": 2, "seq": 32, "batch": 2, "chars": 12000}},
    "full": {"reps": 3, "loader_seconds": 2.0, "rows_4k": 17000, "rows_192k": 1420, "stall_seconds": 4.0,
             "pre_rows": 12000, "pre_dim": 256, "ckpt_hidden": 2048, "ckpt_reps": 5, "scale_steps": 40,
             # 5b: two ranks on two cores vary by about 10 % from run to run; 5 alternated runs
             # of 160 steps each put the medians' noise near the 2 % being judged
             "guards_steps": 160, "guards_reps": 5, "guard_step_steps": 50,
             "scale_rows": 20000, "over_rows": 20000, "over_target_s": 70.0, "growth_rows": 2000,
             "growth_samples": 4096, "limit_mb": 64, "chunk_mb": 2.0, "timeout": 900,
             "images": 4096, "token_windows": 131072, "typed_seconds": 3.0, "typed_reps": 3,
             "image_folder": 4096,  # 8c's JPEGs; 8d/8e ingest 1/16, 1/4 and all of them
             "sweep_trials": 8, "sweep_steps": 30, "sweep_rows": 20000,
             # one sweep of 32 short trials; the orchestrator's peak RSS is read as 4, 8, 16, 32 have finished
             "sweep_memory_trials": [4, 8, 16, 32], "sweep_memory_steps": 2,
             "retrain_epochs": 1,
             # 24 blocks of d_model 1024: 302 M parameters in the blocks, 311 M in all
             "fsdp": {"d_model": 1024, "layers": 24, "vocab": 4096, "heads": 16, "batch": 4, "seq": 128,
                      "steps": 1, "units": ""},  # units: the size-based policy
             # 5e through python -m pipelines train: a team's transformer like the 144M one,
             # 12 blocks of d_model 1024 (151 M parameters), one epoch of a few steps
             "fsdp_train": {"d_model": 1024, "layers": 12, "heads": 16, "seq": 128, "batch": 2, "chars": 12000}},
}
IMAGE_PEERS = ("streaming", "webdataset")
PEERS = ("streaming", "webdataset", "pandas")


class Ctx:
    """One run's settings: the size's parameters, where generated data goes, whether peers run."""

    def __init__(self, size: str, data: Path, peers: bool):
        self.size, self.p, self.data, self.peers = size, SIZES[size], data, peers
        self.py = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
        self.peer_problem: str | None = None

    def probe(self, name: str, args: dict, timeout: float | None = None, env: dict | None = None) -> dict:
        return run_json([self.py, "-m", "benchmarks.probes", name, "--args", json.dumps(args)],
                        timeout=timeout or self.p["timeout"], env=env)


def ensure_peers(ctx: Ctx) -> None:
    """The peers' venv, installed when missing; what went wrong is kept as the peers' reason."""
    if not ctx.peers:
        ctx.peer_problem = "peers not run (--no-peers)"
        return
    if (PEERS_VENV / ".installed").exists():
        return
    p = subprocess.run(["bash", str(BENCH / "peers_setup.sh")], capture_output=True, text=True, timeout=1200)
    if p.returncode != 0 or not (PEERS_VENV / ".installed").exists():
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if not ln.startswith("WARNING: Location")]
        ctx.peer_problem = "peers' venv could not be installed: " + " | ".join(lines[-3:])


# ---------------------------------------------------------------- the table's cells
SIDE_BY_SIDE = "side by side"


@dataclass(frozen=True)
class Row:
    figure: str
    measured: str  # the ratio (or figure) the target is about
    side: str  # the figures behind it
    target: str
    ok: bool | None  # met, missed, or None for a figure only reported
    how: str = SIDE_BY_SIDE  # SIDE_BY_SIDE (repetitions interleaved in this run), or what was alone about it

    def markdown(self) -> str:
        cells = [self.figure, self.measured, self.side, self.target, met(self.ok), self.how]
        return "| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |"


class Rows(list):
    """Collects a renderer's rows: ``add(figure, measured, side, target, ok, how=...)``."""

    def add(self, figure: str, measured: str, side: str, target: str, ok: bool | None,
            how: str = SIDE_BY_SIDE) -> None:
        self.append(Row(figure, measured, side, target, ok, how))


def fmt(x: float | None, spec: str = "{:.2f}") -> str:
    return "n/a" if x is None else spec.format(x)


def met(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def measured(entry: dict | None) -> bool:
    """Whether results.json's entry holds figures (not missing, not an error)."""
    return bool(entry) and "error" not in entry
