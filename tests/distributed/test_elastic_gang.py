"""An elastic gang on this machine (resources/launch/gang.py): two torchrun agents, "nodes" of one
gloo rank each, ``--nnodes=1:2``. Node 1 is lost whole (agent and rank SIGKILLed) after the second
checkpoint: node 0 goes on alone from the last checkpoint, the gang starts node 1 again, it joins
at the next rendezvous and the training ends on two ranks. A team's own training function
(tests/runtime/sample_order_train.py, which stops at ctx.should_stop()) records the samples each rank trains on: the steps kept from
each attempt hold each epoch's samples exactly once, and metrics.json records
both resizes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resources.launch.base import TrainingJob
from resources.launch.local import torchrun_command, worker_env
from tests.distributed.elastic_checks import check_whole_epochs, elastic_config, problem
from tests.k8s.local_cluster import process_tree

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
N, PER_SHARD, BATCH, EPOCHS, EVERY = 96, 16, 16, 6, 4  # 6 steps an epoch, 36 in all
STEP_S = 0.4  # rank 0 sleeps this long each step, so the kill lands mid-training


def _kill_node(log_dir: Path, node: int) -> None:
    pid = json.loads((log_dir / "nodes.json").read_text())[str(node)]["pid"]
    for p in process_tree(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_lost_node_leaves_the_gang_which_goes_on_then_grows_back_when_it_returns(tmp_path):
    manifest, locations = problem(tmp_path, N, PER_SHARD)
    cfg = elastic_config(tmp_path, manifest, locations, nodes=(1, 2), per_node=1, batch=BATCH, epochs=EPOCHS,
                         every=EVERY)
    Path(cfg["checkpoint"]["dir"]).parent.mkdir(parents=True)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(cfg))
    job = TrainingJob(name="elastic-test", config=cfg, nproc_per_node=1, nnodes=2, min_nodes=1, max_restarts=3)
    log_dir = tmp_path / "logs"
    command = torchrun_command(job, config_path, log_dir=log_dir)
    assert command[2] == "resources.launch.gang" and "--nodes" in command and "1:2" in command
    # The replacement comes after the lost node's rendezvous lease has expired (3 x 5 s), so the
    # gang re-forms with one node first.
    command[command.index("--"):command.index("--")] = ["--replace-after-s=25"]
    env = {k: v for k, v in worker_env(job, []).items()}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), env["PYTHONPATH"]]), OMP_NUM_THREADS="1",
               TRAINING_RUNTIME_FAULT_SLOW_RANK=f"0:{STEP_S}")
    env = {k: v for k, v in env.items() if not k.startswith(("DAGSTER_PIPES", "TORCHELASTIC_"))}
    out = tmp_path / "gang.log"
    with out.open("w") as sink:
        gang = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not (Path(cfg["checkpoint"]["dir"]) / f"step_{2 * EVERY:09d}").exists():
                assert gang.poll() is None and time.monotonic() < deadline, out.read_text()[-4000:]
                time.sleep(0.2)
            _kill_node(log_dir, 1)
            gang.wait(timeout=300)
        finally:
            if gang.poll() is None:
                gang.kill()
    text = out.read_text()
    assert gang.returncode == 0, text[-6000:]
    assert "gang: node 1 was lost (killed by SIGKILL)" in text and "gang: node 1 starts again (start 2)" in text

    metrics = json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())
    assert metrics["steps"] == EPOCHS * N // BATCH
    # the guards judge each group alone: a resize is no hang
    assert not [d for d in metrics["detections"] if d["detector"] == "hang"], metrics["detections"]
    assert [a["world_size"] for a in metrics["attempts"]] == [2, 1, 2], metrics["attempts"]
    assert [(r["from_world_size"], r["to_world_size"]) for r in metrics["resizes"]] == [(2, 1), (1, 2)]
    assert "a node left the gang" in metrics["resizes"][0]["reason"]
    assert "a node joined the gang" in metrics["resizes"][1]["reason"]
    assert "the gang resized from 2 to 1 ranks" in text and "the gang resized from 1 to 2 ranks" in text
    # every attempt's ranks agreed on its record (rank 0 names it): three folders, one per group
    attempts = sorted(p.name for p in (Path(cfg["checkpoint"]["dir"]).parent / "attempts").iterdir())
    assert [a.split("-")[1] for a in attempts] == ["R000", "R001", "R002"]

    # The samples: each attempt's steps up to where the next one resumed, counted per rank.
    kept = check_whole_epochs(cfg, manifest, metrics, batch=BATCH)
    assert {(r["world"], r["rank"]) for r in kept} == {(2, 0), (2, 1), (1, 0)}
