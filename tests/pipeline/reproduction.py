"""``python -m pipelines reproduce MODEL 1 --exact`` against a test platform, checked: every figure
and the weights' bytes are the original's. The task pipelines' tests call it on the versions they
registered (a regression and a language model; tests/cli reproduces the digits classifier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def assert_reproduced_exactly(platform, model: str, metric: str) -> None:
    """Reproduce version 1 of ``model`` from its lineage record alone (torchrun on this machine, as
    recorded) and require the same sha256, a zero weight difference and the same ``metric``."""
    from core.registry import read_lineage

    # The CLI finds the platform at DAGSTER_HOME/platform: the test platform's data root.
    assert platform.profile.data_root == platform.root / "platform"
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE")}
    work = platform.root / f"repro-{model}"
    done = subprocess.run([sys.executable, "-m", "pipelines", "reproduce", model, "1", "--exact", "--work-dir",
                           str(work)], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**env, "DAGSTER_HOME": str(platform.root), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the weights are the same bytes" in done.stdout
    figures = {f["figure"]: f for f in json.loads((work / "reproduction.json").read_text())["figures"]}
    sha = figures["weights sha256"]
    assert sha["original"] == sha["reproduction"] == read_lineage(platform.store(), model, 1)["checkpoint"]["sha256"]
    assert sha["within_tolerance"] and figures["max |weight difference|"]["reproduction"] == 0.0
    assert figures[metric]["original"] == figures[metric]["reproduction"]
