"""The disk filling up (a file-size quota, RLIMIT_FSIZE) while writing a checkpoint or shards gives a
clear error and leaves the previous checkpoint valid and nothing half-written."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.reliability.conftest import repeats
from tests.runtime.helpers import REPO

_CHECKPOINT_SCRIPT = textwrap.dedent("""
    import resource, signal, sys, torch
    from pathlib import Path
    from training_runtime.checkpoint.full import write_checkpoint
    root = Path(sys.argv[1]); limit = int(sys.argv[2])
    write_checkpoint(root, 1, {"step": 1, "w": torch.zeros(16)})           # small: fits
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)                          # get EFBIG, not a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    write_checkpoint(root, 2, {"step": 2, "w": torch.zeros(1 << 20)})      # 4 MiB: over the quota
""")

_SHARDS_SCRIPT = textwrap.dedent("""
    # What the shards asset does: build into a temporary directory, then replace the prefix on the
    # run branch. A previous shard set is committed on the branch before the quota is set.
    import json, resource, signal, sys, tempfile
    import numpy as np, pandas as pd
    from pathlib import Path
    from assets.pipeline import _replace_prefix
    from assets.sharding import build_shards
    from resources.store.local import LocalVersionedStore
    root = Path(sys.argv[1]); limit = int(sys.argv[2])
    store = LocalVersionedStore(root / "store", "repo"); store.ensure_repository()
    store.create_branch("run-1", exist_ok=True)
    store.put_object("run-1", "shards/manifest.json", json.dumps({"previous": True}).encode())
    store.commit("run-1", "previous shards")
    n = 4000
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(n, 64)).astype("float32"),
                         columns=[f"f{i}" for i in range(64)])
    frame["y"] = [str(i % 3) for i in range(n)]; frame["id"] = [f"r{i}" for i in range(n)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        manifest = build_shards(frame, out_dir=Path(tmp), feature_columns=tuple(f"f{i}" for i in range(64)),
                                label_column="y", class_names=("0", "1", "2"), id_column="id",
                                feature_shape=(64,), seed=0, fractions=(0.8, 0.1, 0.1), samples_per_shard=2048)
        _replace_prefix(store, "run-1", "shards/", Path(tmp), manifest)
""")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_disk_full_while_writing_a_checkpoint(tmp_path, ledger, case):
    from training_runtime.checkpoint.full import find_latest_valid, list_checkpoints

    limit = 64 * 1024 * (1 + case)  # the quota cuts the write at a different point each case
    done = _run(_CHECKPOINT_SCRIPT, str(tmp_path), str(limit))
    refused = done.returncode != 0 and "File too large" in done.stderr
    latest = find_latest_valid(tmp_path)
    nothing_lost = latest is not None and latest[1]["step"] == 1 and [s for s, _ in list_checkpoints(tmp_path)] == [1]
    ledger.record("fault: disk full during checkpoint write", refused, nothing_lost, "RLIMIT_FSIZE quota")
    assert refused, done.stderr[-2000:]
    assert nothing_lost


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_disk_full_while_writing_shards(tmp_path, ledger, case):
    from resources.store.local import LocalVersionedStore

    # The largest shard file is 2,048 x 264 bytes = 540,672: every quota here cuts one of them.
    limit = 100_000 + 40_000 * case
    done = _run(_SHARDS_SCRIPT, str(tmp_path), str(limit))
    refused = done.returncode != 0 and "File too large" in done.stderr
    store = LocalVersionedStore(tmp_path / "store", "repo")
    nothing_lost = (not store.has_uncommitted_changes("run-1")
                    and store.get_object("run-1", "shards/manifest.json") == b'{"previous": true}'
                    and not [p for p in tmp_path.iterdir() if p.name.startswith("tmp")])
    ledger.record("fault: disk full during shard write", refused, nothing_lost,
                  "RLIMIT_FSIZE quota; the branch keeps its previous shard set")
    assert refused, done.stderr[-2000:]
    assert nothing_lost
