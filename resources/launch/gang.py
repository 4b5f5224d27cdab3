"""A gang of torchrun agents on this machine, one per node, as a multi-node training runs them:
``python -m resources.launch.gang --lock FILE --nodes MIN:MAX --nproc N --run-id ID -- ARGS...``.

Each node is a torchrun agent process (``--nnodes=MIN:MAX``, c10d rendezvous) with its ranks, in a
process group of its own, so a node can be lost whole (its agent and ranks killed) as a pod is.
The rendezvous store is hosted here, not by an agent: a lost node takes nothing the others need,
as on Kubernetes, where the store lives in a pod of its own (resources/k8s/manifests.py).

What the gang does (the local stand-in of a Kubernetes Job's controller):
- a node killed by a signal (SIGKILL: the OOM killer, an operator, a test) is lost: the others
  re-form without it from the last checkpoint while at least MIN remain (torchrun's own elastic
  agent does that part), and the gang starts a replacement after ``--replace-after-s``, which joins
  at the next rendezvous (at most ``--max-replacements``);
- a node whose agent exits with a code decided it (out of restarts, a failure a restart repeats,
  a rendezvous that timed out below MIN): not replaced; the gang fails with the first such code
  once no node runs;
- the first node to exit 0 means the training completed: the others follow within
  ``--exit-grace-s`` or are ended, replacements still waiting in the rendezvous included.
Like supervise.py, it holds the checkpoint directory's lock and ends every node when the process
that launched it dies. ``nodes.json`` in ``--log-dir`` lists each node's agent pid as it starts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from resources.launch.supervise import _acquire, _end_group

POLL_S = 0.2
GANG_FILE = "gang.json"  # the gang's failure, in its launch's log folder


@dataclass
class Node:
    index: int
    starts: int = 0  # how many times this node was started
    proc: subprocess.Popen | None = None
    start_at: float | None = None  # a replacement's start time (monotonic), while it waits
    history: list[dict] = field(default_factory=list)


def agent_command(args: argparse.Namespace, port: int, node: Node, worker: list[str]) -> list[str]:
    low, high = args.nodes
    conf = f"is_host=false,join_timeout={args.join_timeout_s:g},last_call_timeout={args.last_call_s:g}"
    log = [f"--log-dir={Path(args.log_dir) / f'node_{node.index}-{node.starts}'}", "--tee=3"] if args.log_dir else []
    return [args.python, "-m", "torch.distributed.run", f"--nnodes={low}:{high}" if low != high else f"--nnodes={high}",
            f"--nproc-per-node={args.nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={args.run_id}", f"--rdzv-conf={conf}", f"--max-restarts={args.max_restarts}",
            "--monitor-interval=1", *log, *worker]


def node_env(args: argparse.Namespace, node: Node) -> dict[str, str]:
    low, high = args.nodes
    env = {**os.environ,
           # Each round's workers get a store of their own: with the agents' shared one, a node that
           # stays rank 0 across a round keeps the last round's master address and a joining node
           # waits for it for ever (torch dynamic_rendezvous.py, next_rendezvous).
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "PLATFORM_NODE": str(node.index)}
    if low != high:
        env["PLATFORM_ELASTIC"] = f"{low}:{high}"
    if args.devices:  # this node's share of the GPUs reserved for the launch
        devices = args.devices.split(",")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[node.index * args.nproc:(node.index + 1) * args.nproc])
    return env


def say(message: str) -> None:
    print(f"gang: {message}", file=sys.stderr, flush=True)


def _write_nodes(args: argparse.Namespace, nodes: list[Node]) -> None:
    if not args.log_dir:
        return
    path = Path(args.log_dir) / "nodes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({str(n.index): {"pid": n.proc.pid if n.proc else None, "starts": n.starts,
                                              "history": n.history} for n in nodes}, indent=2))
    os.replace(tmp, path)


def _start(args: argparse.Namespace, port: int, node: Node, worker: list[str], nodes: list[Node]) -> None:
    node.proc = subprocess.Popen(agent_command(args, port, node, worker), env=node_env(args, node),
                                 start_new_session=True)
    node.starts += 1
    node.start_at = None
    node.history.append({"started": time.time(), "pid": node.proc.pid})
    _write_nodes(args, nodes)


def _failure_message(args: argparse.Namespace, lost: list[int], code: int | None) -> str:
    low, high = args.nodes
    if lost and high - len(lost) < low:
        return (f"the gang fell below min_nodes={low}: node(s) {', '.join(map(str, lost))} were lost and no "
                f"replacement was left ({args.max_replacements} used), so the {high - len(lost)} node(s) left waited "
                f"for the rendezvous for its join timeout ({args.join_timeout_s:g} s) and gave up")
    return f"no node runs any more; the training failed (exit code {code})"


def _write_outcome(args: argparse.Namespace, message: str, code: int) -> None:
    """``gang.json`` in the launch's log folder: the launcher names the gang's failure with it."""
    if args.log_dir:
        path = Path(args.log_dir) / GANG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"returncode": code, "message": message}))


def _end_all(nodes: list[Node], grace_s: float) -> None:
    for n in nodes:
        if n.proc is not None and n.proc.poll() is None:
            _end_group(n.proc, grace_s)


def run(args: argparse.Namespace, worker: list[str]) -> int:
    from torch.distributed import TCPStore  # the agents' rendezvous store; imported after the lock

    low, high = args.nodes
    store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=args.join_timeout_s))
    say(f"{high} node(s) of {args.nproc} rank(s), {'elastic down to ' + str(low) if low != high else 'fixed size'}; "
        f"rendezvous store on 127.0.0.1:{store.port}")
    nodes = [Node(i) for i in range(high)]
    for n in nodes:
        _start(args, store.port, n, worker, nodes)
    parent, replacements, failure, done_at, lost = os.getppid(), 0, None, None, []
    try:
        while True:
            now = time.monotonic()
            if os.getppid() != parent:
                say("the process that launched training died; ending every node")
                _end_all(nodes, args.grace_s)
                return 1
            for n in nodes:
                if n.proc is None or n.proc.poll() is None:
                    continue
                rc, n.proc = n.proc.returncode, None
                n.history[-1].update(ended=time.time(), returncode=rc)
                _write_nodes(args, nodes)
                running = sum(m.proc is not None for m in nodes)
                if rc == 0:
                    if done_at is None:
                        say(f"node {n.index} completed the training; waiting up to {args.exit_grace_s:g} s for the others")
                        done_at = now
                elif rc == -signal.SIGKILL and done_at is None:
                    lost.append(n.index)
                    left = replacements < args.max_replacements
                    say(f"node {n.index} was lost (killed by SIGKILL); {running} of {high} node(s) remain and "
                        f"re-form from the last checkpoint if at least {low} do"
                        + (f"; a replacement starts in {args.replace_after_s:g} s" if left else
                           f"; no replacement left ({args.max_replacements} used)"))
                    if left:
                        replacements += 1
                        n.start_at = now + args.replace_after_s
                elif done_at is None:
                    say(f"node {n.index} ended with exit code {rc}; it is not replaced "
                        "(its agent gave up: out of restarts, a failure a restart repeats, or a rendezvous "
                        f"that could not gather {low} node(s))")
                    failure = failure if failure is not None else (rc if rc > 0 else 1)
            for n in nodes:
                if n.start_at is not None and now >= n.start_at and done_at is None:
                    say(f"node {n.index} starts again (start {n.starts + 1}) and joins at the next rendezvous")
                    _start(args, store.port, n, worker, nodes)
            running = [n for n in nodes if n.proc is not None]
            waiting = [n for n in nodes if n.start_at is not None]
            if done_at is not None:
                if not running:
                    return 0
                if now - done_at > args.exit_grace_s:
                    say(f"ending node(s) {[n.index for n in running]} {args.exit_grace_s:g} s after the training completed")
                    _end_all(running, args.grace_s)
                    return 0
            elif not running and not waiting:
                message = _failure_message(args, lost, failure)
                say(message)
                _write_outcome(args, message, failure if failure is not None else 1)
                return failure if failure is not None else 1
            time.sleep(POLL_S)
    finally:
        _end_all(nodes, args.grace_s)


def _nodes(value: str) -> tuple[int, int]:
    low, _, high = value.partition(":")
    low_n, high_n = int(low), int(high or low)
    if not 1 <= low_n <= high_n:
        raise argparse.ArgumentTypeError(f"--nodes {value!r}: need 1 <= MIN <= MAX")
    return low_n, high_n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resources.launch.gang")
    parser.add_argument("--lock", required=True, help="lock file of the checkpoint directory")
    parser.add_argument("--lock-wait-s", type=float, default=120.0)
    parser.add_argument("--nodes", type=_nodes, required=True, help="MIN:MAX nodes (MAX alone: a fixed gang)")
    parser.add_argument("--nproc", type=int, required=True, help="ranks per node")
    parser.add_argument("--run-id", required=True, help="the rendezvous id")
    parser.add_argument("--max-restarts", type=int, default=1)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--devices", default="", help="GPUs reserved for the launch, comma-separated")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--join-timeout-s", type=float, default=600.0)
    parser.add_argument("--last-call-s", type=float, default=2.0)
    parser.add_argument("--replace-after-s", type=float, default=10.0)
    parser.add_argument("--max-replacements", type=int, default=None, help="default: --max-restarts")
    parser.add_argument("--exit-grace-s", type=float, default=60.0)
    parser.add_argument("--grace-s", type=float, default=30.0)
    parser.add_argument("worker", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    worker = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    if not worker:
        parser.error("give the worker's torchrun arguments after --")
    if args.max_replacements is None:
        args.max_replacements = args.max_restarts
    lock_fd = _acquire(args.lock, args.lock_wait_s)

    def forward(signum, _frame):  # a cancelled run: end every node, then exit
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        return run(args, worker)
    finally:
        os.close(lock_fd)


if __name__ == "__main__":
    sys.exit(main())
