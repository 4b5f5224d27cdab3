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


# Rank 0 stops (SIGSTOP) once, after hosting the attempt's store and before joining: its peer's
# client would wait on the stopped store for ever; the joining deadline ends the peer, torchrun's
# agents restart the gang (node 0's SIGKILLs the stopped rank) and it meets.
HUNG_HOST = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import torch.distributed as dist
    from training_runtime.distributed.process_group import close_distributed, init_distributed
    rank, restart = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
    once = Path(sys.argv[1])
    if rank == 0 and not once.exists():
        once.write_text("stopped")
        dist.init_process_group = lambda *a, **k: os.kill(os.getpid(), signal.SIGSTOP)
    info = init_distributed("cpu", timeout_s=8, io_timeout_s=8)
    dist.barrier()
    print(f"rank {info.rank} of {info.world_size} met its peer (restart count {restart})", flush=True)
    close_distributed()
""")


def _gang(tmp_path, worker: str, *args: str, timeout_s: float = 150) -> tuple[list[int], str]:
    script = tmp_path / "worker.py"
    script.write_text(worker)
    (port,) = free_ports(1)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "TORCHELASTIC_"))},
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=gang",
                                f"--local-addr={addr}", "--max-restarts=1", "--monitor-interval=0.2", str(script),
                                *args],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for addr in ("127.0.0.1", "127.0.0.2")]
    try:
        outputs = [agent.communicate(timeout=timeout_s)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return [a.returncode for a in agents], "\n".join(outputs)


@pytest.mark.slow
def test_a_peer_of_a_rank_0_stopped_while_hosting_the_store_ends_and_the_gang_meets_again(tmp_path):
    codes, text = _gang(tmp_path, HUNG_HOST, str(tmp_path / "stopped-once"))
    assert codes == [0, 0], text[-4000:]
    assert "joining the process group took over 18 s" in text, text[-4000:]
    assert "rank 0 of 2 met its peer" in text and "rank 1 of 2 met its peer" in text, text[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("failing", [0, 1])
def test_a_two_node_gang_meets_again_after_one_node_restarts(tmp_path, failing):
    codes, text = _gang(tmp_path, WORKER.replace("FAILING", str(failing)))
    assert codes == [0, 0], text[-4000:]
    assert f"rank {failing} of 2 met its peer (restart count 1)" in text, text[-4000:]
    assert f"rank {1 - failing} of 2 met its peer" in text, text[-4000:]
