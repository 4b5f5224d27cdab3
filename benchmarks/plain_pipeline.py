"""The same compute as the benchmark pipeline without the platform: read the CSV with pandas,
split 80/10/10, normalise on train, train the same MLP with the same optimizer, schedule, batch
and number of steps on 2 gloo ranks under torchrun (``benchmarks.plain_train``), evaluate on the
test and validation splits. Prints one JSON line with its wall time and the training part."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import REPO, emit


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args(argv)
    frame = pd.read_csv(a.source)
    x = frame[[f"f{i}" for i in range(a.dim)]].to_numpy(dtype=np.float32)
    y = frame["label"].to_numpy(dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    n_tr, n_va = int(0.8 * len(y)), int(0.1 * len(y))
    parts = {"train": order[:n_tr], "validation": order[n_tr:n_tr + n_va], "test": order[n_tr + n_va:]}
    mean, std = x[parts["train"]].mean(0), x[parts["train"]].std(0) + 1e-12
    with tempfile.TemporaryDirectory(prefix="plain-") as tmp:
        for name, idx in parts.items():
            np.save(Path(tmp) / f"{name}_x.npy", (x[idx] - mean) / std)
            np.save(Path(tmp) / f"{name}_y.npy", y[idx])
        t_prep = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "-m", "benchmarks.plain_train", "--data", tmp, "--epochs", str(a.epochs), "--batch", str(a.batch)]
        subprocess.run(cmd, check=True, env=env, cwd=REPO, capture_output=True)
        result = json.loads((Path(tmp) / "result.json").read_text())
    emit({"wall_s": time.perf_counter() - t0, "prepare_s": t_prep - t0, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
