"""A training function for the rank-log tests (``train_fn = "tests.ops.rank_log_workers:..."``):
each rank says who it is on its own stdout and stderr, then the attempt fails on both ranks."""

from __future__ import annotations

import os
import sys

from training_runtime.train.context import TrainingContext


def introduce_then_fail(ctx: TrainingContext) -> None:
    """Both ranks raise a failure a restart may fix (a RuntimeError), so torchrun restarts them."""
    rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"stdout line of rank {rank}, attempt {attempt}")
    print(f"stderr line of rank {rank}, attempt {attempt}", file=sys.stderr)
    raise RuntimeError(f"rank {rank} fails on purpose in attempt {attempt}")
