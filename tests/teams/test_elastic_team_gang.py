"""An elastic gang for a team's code location outside the repository, as a user runs it: the relay
team's package (tests/teams/elastic_team_package, copied to a temporary folder as ``relay``, which
nothing in the repository can import) with its own training function, trained by
``python -m pipelines train relay --set train.nnodes=2 --set train.min_nodes=1`` on an empty
DAGSTER_HOME. The local launcher runs a gang of two torchrun agents (resources/launch/gang.py),
each handed the launcher's worker env, the team's folder on PYTHONPATH included; node 1 is killed
whole (agent and rank, SIGKILL) after checkpoint 8. The gang goes on, node 1 comes back, the run
registers version 1, and the samples the team's function recorded, counted over the steps each
attempt kept, make whole epochs: every training sample in every epoch, no step lost or twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from core.registry import list_versions, read_lineage
from pipelines.profiles import Profile
from tests.distributed.elastic_checks import kept_rows
from tests.k8s.local_cluster import signal_tree_when
from training_runtime.data.sampling import epoch_positions

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).resolve().parent / "elastic_team_package"
BATCH, EVERY = 16, 4  # the team's recipe
STEP_S = 0.3  # rank 0 takes this long a step (the runtime's pacing hook), so the kill lands mid-training


def _node_after_checkpoint(platform: Path, node: int) -> tuple[str, int] | None:
    if list(platform.glob(f"checkpoints/relay/*/checkpoints/step_{2 * EVERY:09d}")):
        (nodes,) = platform.glob("launches/**/nodes.json")
        pid = json.loads(nodes.read_text())[str(node)]["pid"]
        return str(pid), pid  # SIGKILL to the node's whole tree, agent and rank: the machine is gone
    return None


def test_a_team_package_outside_the_repository_trains_as_an_elastic_gang_that_loses_a_node(tmp_path):
    team_root = tmp_path / "team-code"
    shutil.copytree(TEMPLATE, team_root / "relay", ignore=shutil.ignore_patterns("__pycache__"))
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - python_module:\n      module_name: relay.definitions\n"
                         "      attribute: defs\n      location_name: relay\n"
                         f"      working_directory: {team_root}\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE", "PYTHONPATH") and not k.startswith(
               ("TRAINING_RUNTIME_FAULT_", "DAGSTER_PIPES"))}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO), TRAINING_RUNTIME_FAULT_SLOW_RANK=f"0:{STEP_S}")
    platform = home / "platform"
    killed = signal_tree_when(lambda: _node_after_checkpoint(platform, 1), signal.SIGKILL, timeout_s=400)
    proc = subprocess.run([sys.executable, "-m", "pipelines", "train", "relay", "--set", "train.nnodes=2",
                           "--set", "train.min_nodes=1", "--workspace", str(workspace)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert killed, "node 1 was never killed: the training published no checkpoint 8"

    (metrics_path,) = platform.glob("checkpoints/relay/*/output/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    resolved = json.loads((metrics_path.parent / "resolved_config.json").read_text())
    assert resolved["elastic"] == "1:2" and resolved["train_fn"] == "relay.train:fit"
    # The node's loss restarted the gang: at least one attempt after the first, resumed from a
    # checkpoint, every attempt at 1 or 2 ranks.
    attempts = metrics["attempts"]
    assert len(attempts) >= 2 and attempts[1]["resumed_from_step"] >= EVERY, attempts
    assert {a["world_size"] for a in attempts} <= {1, 2}, attempts
    total, per_epoch = resolved["total_steps"], resolved["steps_per_epoch"]
    assert metrics["steps"] == total

    # The team's function ran on both nodes (its package reached each agent's ranks) ...
    checkpoint_dir = metrics_path.parent.parent / "checkpoints"
    kept = kept_rows({"checkpoint": {"dir": str(checkpoint_dir)}})
    assert {(r["world"], r["rank"]) for r in kept} >= {(2, 0), (2, 1)}, {(r["world"], r["rank"]) for r in kept}
    # ... every step was kept once with its share of the epoch (the whole global batch, but for
    # an epoch's last step, which holds what is left of the epoch's positions) ...
    train_samples = sum(s["num_samples"] for s in resolved["data"]["manifest"]["splits"]["train"]["shards"])
    positions = epoch_positions(train_samples, resolved["data"]["partitions"], BATCH)
    per_step = Counter()
    for r in kept:
        per_step[r["step"]] += len(r["ids"])
    expected = {s: min(BATCH, positions - ((s - 1) % per_epoch) * BATCH) for s in range(1, total + 1)}
    assert per_step == Counter(expected), sorted((s, n, expected.get(s)) for s, n in per_step.items()
                                                 if n != expected.get(s))
    # ... and each epoch held every training sample (its key as the shards hold it), only the
    # sampler's padding to a multiple of its partitions repeated.
    epochs = [Counter(k for r in kept if (r["step"] - 1) // per_epoch == e for k in r["ids"])
              for e in range(total // per_epoch)]
    assert len(epochs) == 8
    for e, seen in enumerate(epochs):
        assert len(seen) == train_samples, f"epoch {e}: {len(seen)} distinct samples of {train_samples}"
        assert sum(seen.values()) == positions, f"epoch {e}"
        assert set(seen) == set(epochs[0]), f"epoch {e} trained on other samples than epoch 0"

    store = Profile(name="local", data_root=platform).store()
    assert list_versions(store, "relay") == [1]
    record = read_lineage(store, "relay", 1)
    assert record["training"]["config"]["train_fn"] == "relay.train:fit"
    assert "relay v1" in proc.stdout  # the CLI printed the version it registered
