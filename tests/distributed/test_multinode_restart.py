"""A gang of two torchrun agents (two "nodes", one rank each, c10d rendezvous on loopback) whose
second node's worker fails once must meet again in the restarted attempt.

Found by the soak (tests/reliability/soak, Kubernetes path): only the failing agent counts the
restart, so with the workers' store shared by torchrun and namespaced by that count, rank 0
waited under attempt_0 and rank 1 under attempt_1 until every restart was spent. The pods of a
multi-node Job run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (resources/k8s/manifests.py), as
the agents here do, and training_runtime/distributed/process_group.py gives each attempt a
fresh store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.ports import free_ports

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]

# Joins through the runtime's own init_distributed; one node's first worker fails before joining
# (node 0's: the store's own host).
WORKER = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    from training_runtime.distributed.process_group import close_distributed, init_distributed
    rank, restart = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
    if rank == FAILING and restart == "0":
        sys.exit(3)
    info = init_distributed("cpu", timeout_s=20, io_timeout_s=20)
    dist.barrier()
    print(f"rank {info.rank} of {info.world_size} met its peer (restart count {restart})", flush=True)
    close_distributed()
""")


@pytest.mark.slow
@pytest.mark.parametrize("failing", [0, 1])
def test_a_two_node_gang_meets_again_after_one_node_restarts(tmp_path, failing):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("FAILING", str(failing)))
    (port,) = free_ports(1)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "TORCHELASTIC_"))},
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=gang",
                                f"--local-addr={addr}", "--max-restarts=1", "--monitor-interval=0.2", str(script)],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for addr in ("127.0.0.1", "127.0.0.2")]
    try:
        outputs = [agent.communicate(timeout=150)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    text = "\n".join(outputs)
    assert [a.returncode for a in agents] == [0, 0], text[-4000:]
    other = 1 - failing
    assert f"rank {failing} of 2 met its peer (restart count 1)" in text, text[-4000:]
    assert f"rank {other} of 2 met its peer" in text, text[-4000:]
