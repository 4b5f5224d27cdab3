"""Elastic gangs under faults, through the local launcher (real torchrun agents as nodes, real
Dagster Pipes): a node lost while above min_nodes and rejoining, a node lost at min_nodes (the
run fails by name after the rendezvous timeout), and a node lost while it writes a checkpoint.
Each case is a class of the reliability report; nothing lost means: every optimizer step trained
once in the weights' history, each epoch's samples exactly once, and no checkpoint half published.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from resources.launch.base import TrainingJob
from resources.launch.local import LocalTorchrunLauncher
from tests.distributed.elastic_checks import check_whole_epochs, elastic_config, problem
from tests.k8s.local_cluster import process_tree
from training_runtime.checkpoint import full as ckpt

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
N, PER_SHARD, BATCH, EVERY = 96, 16, 24, 4  # 4 steps an epoch; 24 splits over 1, 2 and 3 ranks
STEP_S = 0.4


def _job(root: Path, *, nodes: tuple[int, int], epochs: int, env: dict[str, str] | None = None):
    manifest, locations = problem(root / "data", N, PER_SHARD)
    cfg = elastic_config(root, manifest, locations, nodes=nodes, per_node=1, batch=BATCH, epochs=epochs,
                         every=EVERY)
    job = TrainingJob(name="elastic-fault", config=cfg, nproc_per_node=1, nnodes=nodes[1], min_nodes=nodes[0],
                      max_restarts=3, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                                           "TRAINING_RUNTIME_FAULT_SLOW_RANK": f"0:{STEP_S}", **(env or {})})
    return job, manifest


def _kill_node(launcher: LocalTorchrunLauncher, job: TrainingJob, node: int) -> None:
    nodes = sorted(launcher.log_dir(job).glob("launch_*/nodes.json"))[-1]
    for pid in process_tree(json.loads(nodes.read_text())[str(node)]["pid"]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _after_checkpoint(job: TrainingJob, step: int, then) -> threading.Thread:
    def wait_then() -> None:
        deadline = time.monotonic() + 180
        while not (Path(job.config["checkpoint"]["dir"]) / f"step_{step:09d}").exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.2)
        then()
    thread = threading.Thread(target=wait_then, daemon=True)
    thread.start()
    return thread


def _materialize(launcher: LocalTorchrunLauncher, job: TrainingJob, before=None):
    errors: list[BaseException] = []

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        if before is not None:
            before()
        try:
            launcher.launch(context, job)
        except Exception as exc:
            errors.append(exc)
            raise
        return dg.MaterializeResult()

    result = dg.materialize([checkpoint], raise_on_error=False)
    return result, errors


def _metrics(job: TrainingJob) -> dict:
    return json.loads((Path(job.config["output_dir"]) / "metrics.json").read_text())


def _no_half_checkpoint(job: TrainingJob) -> bool:
    """Every published checkpoint verifies against its sha256 manifest."""
    for _, path in ckpt.list_checkpoints(job.config["checkpoint"]["dir"]):
        try:
            ckpt.verify_checkpoint(path)
        except (OSError, ValueError):
            return False
    return True


def test_a_node_lost_above_min_nodes_leaves_and_rejoins(tmp_path, ledger):
    job, manifest = _job(tmp_path, nodes=(1, 2), epochs=16)
    launcher = LocalTorchrunLauncher(tmp_path / "launches", node_replacement_s=25)
    result, _ = _materialize(launcher, job, before=lambda: _after_checkpoint(job, 2 * EVERY,
                                                                             lambda: _kill_node(launcher, job, 1)))
    ok = result.success
    metrics = _metrics(job) if ok else {}
    sizes = [(r["from_world_size"], r["to_world_size"]) for r in metrics.get("resizes", [])]
    ok = ok and sizes == [(2, 1), (1, 2)]
    lost_nothing = ok and bool(check_whole_epochs(job.config, manifest, metrics, batch=BATCH))
    ledger.record("elastic: a node lost while above min_nodes", ok, lost_nothing, "2 -> 1 ranks, training goes on")
    ledger.record("elastic: a lost node rejoining", ok and sizes[-1:] == [(1, 2)], lost_nothing,
                  "1 -> 2 ranks at the next rendezvous")
    assert ok, sizes
    assert lost_nothing


def test_a_node_lost_at_min_nodes_fails_by_name_after_the_rendezvous_timeout(tmp_path, ledger):
    job, _ = _job(tmp_path, nodes=(2, 3), epochs=40)
    launcher = LocalTorchrunLauncher(tmp_path / "launches", rendezvous_join_timeout_s=20, node_replacements=0)

    def lose_two() -> None:
        _kill_node(launcher, job, 1)
        _kill_node(launcher, job, 2)

    started = time.monotonic()
    result, errors = _materialize(launcher, job, before=lambda: _after_checkpoint(job, EVERY, lose_two))
    outcome = launcher.failure_of(job)
    ok = (not result.success and errors and outcome is not None and not outcome.deterministic
          and "the gang fell below min_nodes=2: node(s) 1, 2 were lost" in outcome.message
          and "join timeout (20 s)" in outcome.message)
    lost_nothing = _no_half_checkpoint(job) and bool(list(Path(job.config["checkpoint"]["dir"]).glob("step_*")))
    ledger.record("elastic: a node lost at min_nodes", bool(ok), lost_nothing,
                  "fails, retryable, naming min_nodes and the join timeout; the checkpoints stay for the retry")
    assert ok, outcome and outcome.message
    assert lost_nothing
    assert time.monotonic() - started < 170  # the survivors gave up at the join timeout, not at its default


def test_a_node_lost_while_writing_a_checkpoint_resumes_from_the_last_published_one(tmp_path, ledger):
    # rank 0's node (its agent and rank) dies inside the write of checkpoint 8: node 1 goes on as
    # rank 0 from checkpoint 4, and node 0 comes back
    job, manifest = _job(tmp_path, nodes=(1, 2), epochs=16,
                         env={"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"0:{2 * EVERY}:checkpoint-node"})
    launcher = LocalTorchrunLauncher(tmp_path / "launches", node_replacement_s=25)
    result, _ = _materialize(launcher, job)
    ok = result.success
    metrics = _metrics(job) if ok else {}
    resumed = [a.get("resumed_from_step") for a in metrics.get("attempts", [])]
    ok = ok and resumed[:2] == [None, EVERY] and [a["world_size"] for a in metrics["attempts"]][:2] == [2, 1]
    lost_nothing = ok and _no_half_checkpoint(job) and bool(check_whole_epochs(job.config, manifest, metrics,
                                                                               batch=BATCH))
    ledger.record("elastic: a node lost during a checkpoint write", ok, lost_nothing,
                  "the half-written checkpoint is never published; the rest resume from the one before")
    assert ok, metrics.get("attempts")
    assert lost_nothing
