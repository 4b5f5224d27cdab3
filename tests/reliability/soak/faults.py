"""The soak's faults: every class of RELIABILITY.md, injected into the running platform from
outside, as the world would (a signal, a server going away, a file-size quota), never through a
hook of the code under test. One fault at a time; the next class is drawn at random from a
seeded plan (``FaultPlan``), so a seed replays the same sequence of classes, gaps and settings
(which run each one lands in depends on the platform's timing, and so does the order after a
draw that found nothing to hit).

Targets are found by looking at the machine: a training rank is a process whose command line is
``-m training_runtime --config <data root>/...`` (its environment says its rank, and on the
Kubernetes path its pod and node); a run worker is the pid the run launcher recorded. A fault
that finds no target in time is recorded as not injected and drawn again first in the next round.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import dagster as dg
import psutil

from resources.run_launcher import HealthCheckedRunLauncher
from tests.k8s.local_cluster import process_tree
from tests.reliability.soak.load import Clock, submit
from tests.reliability.soak.pipelines import COLLECTIVE_TIMEOUT_S, HANG_TIMEOUT_S, JOBS
from tests.reliability.soak.watch import NewEntries
from training_runtime.distributed.elastic import ELASTIC_ENV, parse_elastic

TARGET_WAIT_S = 90.0  # how long a targeted fault waits for something to hit
NAN_LR = 1e37  # overflows float32 at the second step (tests/ops/test_training_failures.py)

# Fault class -> the RELIABILITY.md class it is (the soak's report names both).
LOCAL_CLASSES = {
    "worker_kill": "fault: worker SIGKILL mid-step",
    "worker_kill_in_checkpoint_write": "fault: worker SIGKILL mid-checkpoint-write",
    "run_worker_kill": "fault: run worker SIGKILL mid-run",
    "store_errors": "fault: store answering errors mid-run (transient)",
    "store_down": "fault: store down mid-run (beyond retries)",
    "store_restart": "fault: store stopped and restarted mid-run",
    "s3_stopped": "fault: S3 server stopped mid-run (restarted at once, or after the run)",
    "disk_full_checkpoint": "fault: disk full during checkpoint write",
    "disk_full_shards": "fault: disk full during shard write",
    "rank_hang": "guard: a rank that hangs (SIGSTOP; the hang watchdog)",
    "nonfinite_loss": "guard: a non-finite loss (learning rate 1e37)",
}
# An elastic gang's classes (digits on the Kubernetes path is a gang of 1-2 pods): the names are
# those tests/reliability/test_elastic_faults.py gives them in RELIABILITY.md's table.
ELASTIC_CLASSES = {
    "elastic_node_lost": "elastic: a node lost while above min_nodes",
    "elastic_node_rejoin": "elastic: a lost node rejoining",
    "elastic_node_lost_in_checkpoint_write": "elastic: a node lost during a checkpoint write",
}
KUBERNETES_CLASSES = {
    **LOCAL_CLASSES,
    "pod_deleted": "kubernetes: a training pod deleted (its processes SIGTERMed, as the kubelet does)",
    "node_lost": "kubernetes: a node lost (every pod on it SIGKILLed)",
    **ELASTIC_CLASSES,
}


@dataclass
class Fault:
    cls: str
    at: float  # soak seconds
    ended: float | None = None
    unix: float | None = None  # when it struck (time.time()), for the Pipes count of a run whose worker it killed
    injected: bool = False
    cut_short: bool = False  # not injected because the load ended while it waited for a target
    target: dict = field(default_factory=dict)  # model, root run id, run id, pid, rank, pod, node
    detail: str = ""
    error: str | None = None  # the injector itself failed (a soak bug, reported)
    violation: str | None = None  # what the platform failed to do about it, seen by the injector

    def to_dict(self) -> dict:
        return asdict(self)


# --- what is running -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rank:
    pid: int
    rank: int
    world_size: int
    model: str
    root_run_id: str
    checkpoint_dir: Path
    pod: str | None = None
    node: str | None = None
    elastic: tuple[int, int] | None = None  # an elastic gang's (min, max) nodes
    output_dir: Path | None = None  # where the training writes metrics.json

    def describe(self) -> dict:
        return {"model": self.model, "root_run_id": self.root_run_id, "pid": self.pid, "rank": self.rank,
                **({"pod": self.pod, "node": self.node} if self.pod else {}),
                **({"elastic": f"{self.elastic[0]}:{self.elastic[1]}", "world_size": self.world_size}
                   if self.elastic else {})}


def training_ranks(data_root: Path) -> list[Rank]:
    """Live training ranks of this soak's platform (not torchrun's agent, not the supervisor)."""
    ranks = []
    checkpoints = data_root / "checkpoints"
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if "training_runtime" not in cmd or "--config" not in cmd or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any("torch.distributed.run" in a or "torchrun" in a or "resources.launch.supervise" in a for a in cmd):
            continue
        try:
            config = json.loads(Path(cmd[cmd.index("--config") + 1]).read_text())
            env = proc.environ()
            ckpt = Path(config["checkpoint"]["dir"])
            model, root_run_id = ckpt.relative_to(checkpoints).parts[:2]
        except (OSError, ValueError, KeyError, IndexError, psutil.Error):
            continue  # another platform's training, or one that just ended
        ranks.append(Rank(pid=proc.info["pid"], rank=int(env.get("RANK", "0")),
                          world_size=int(env.get("WORLD_SIZE", "1")), model=model, root_run_id=root_run_id,
                          checkpoint_dir=ckpt, pod=env.get("POD_NAME"), node=env.get("NODE_NAME"),
                          elastic=parse_elastic(env.get(ELASTIC_ENV)),
                          output_dir=Path(config["output_dir"]) if config.get("output_dir") else None))
    return ranks


def pod_groups(data_root: Path) -> dict[str, tuple[int, str]]:
    """Pod name -> (its process group, its node) of the simulated cluster's live pods."""
    pods = {}
    for rank in training_ranks(data_root):
        if rank.pod:
            try:
                pods[rank.pod] = (os.getpgid(rank.pid), rank.node or "")
            except ProcessLookupError:
                continue
    return pods


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _send(pid: int, sig: int, fault: Fault, *, group: bool = False) -> bool:
    """Signal a target chosen a moment ago; False, with the fault not injected and saying why,
    when it ended in between (a training finishing as it is picked: drawn again next round)."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        fault.detail = f"the target (pid {pid}) ended before {signal.Signals(sig).name}"
        return False
    return True


# --- the faults ------------------------------------------------------------------------------------
@dataclass
class FaultContext:
    platform: object  # SoakPlatform
    instance: dg.DagsterInstance
    client: object  # DagsterGraphQLClient
    clock: Clock
    stop: threading.Event
    launcher: HealthCheckedRunLauncher = None

    def __post_init__(self) -> None:
        self.launcher = HealthCheckedRunLauncher()
        self.launcher.register_instance(self.instance)

    @property
    def data_root(self) -> Path:
        return self.platform.data_root

    def wait_for(self, find: Callable[[], object], timeout_s: float = TARGET_WAIT_S, poll_s: float = 0.5):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            found = find()
            if found:
                return found
            time.sleep(poll_s)
        return None


def _pick_rank(ctx: FaultContext, rng: random.Random, want: Callable[[Rank], bool] = lambda r: True) -> Rank | None:
    ranks = ctx.wait_for(lambda: [r for r in training_ranks(ctx.data_root) if want(r)])
    return rng.choice(sorted(ranks, key=lambda r: r.pid)) if ranks else None


def worker_kill(ctx, rng, fault: Fault) -> None:
    """A training rank SIGKILLed at a random moment (torchrun restarts the workers)."""
    rank = _pick_rank(ctx, rng)
    if rank is None:
        fault.detail = "no training was running"
        return
    time.sleep(rng.uniform(0.0, 2.0))
    if not _send(rank.pid, signal.SIGKILL, fault):
        return
    fault.injected, fault.target = True, rank.describe()
    fault.detail = f"rank {rank.rank} of {rank.world_size} SIGKILLed"


def worker_kill_in_checkpoint_write(ctx, rng, fault: Fault) -> None:
    """A rank SIGKILLed the moment a checkpoint write of its training begins: a ``.tmp-`` folder
    appears in its checkpoint directory, seen through inotify on the whole checkpoints tree (the
    trainings are short; a write takes milliseconds). The writer is rank 0 for full checkpoints
    and any rank for sharded ones, where each writes its DCP shards."""
    root = ctx.data_root / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + TARGET_WAIT_S
    ranks: dict[Path, list[Rank]] = {}
    refreshed = 0.0
    with NewEntries(root) as watch:
        while time.monotonic() < deadline and not ctx.stop.is_set():
            if time.monotonic() - refreshed > 1.0:  # who writes where, known before a write begins
                ranks = {}
                for r in training_ranks(ctx.data_root):
                    ranks.setdefault(r.checkpoint_dir, []).append(r)
                refreshed = time.monotonic()
            seen = watch.next(timeout_s=0.5)
            if seen is None or not seen[1].startswith(".tmp-"):
                continue
            folder, name = seen
            writers = [r for r in ranks.get(folder, []) if r.rank == 0 or name.endswith("-sharded")]
            if not writers:  # a training that began since the last look
                writers = [r for r in training_ranks(ctx.data_root)
                           if r.checkpoint_dir == folder and (r.rank == 0 or name.endswith("-sharded"))]
            if not writers:
                continue
            victim = rng.choice(sorted(writers, key=lambda r: r.rank))
            still_writing = (folder / name).exists()
            if not _send(victim.pid, signal.SIGKILL, fault):
                return
            fault.injected, fault.target = True, victim.describe()
            fault.detail = (f"rank {victim.rank} SIGKILLed as {name} began to be written"
                            + ("" if still_writing else " (the write may just have finished)"))
            return
    fault.detail = f"no checkpoint write began within {TARGET_WAIT_S:.0f} s"


def run_worker_kill(ctx, rng, fault: Fault) -> None:
    """The run worker of a run that is training SIGKILLed: run monitoring marks the run failed,
    run retries start a new run, which resumes from the dead run's checkpoints."""
    def training_runs():
        roots = {r.root_run_id for r in training_ranks(ctx.data_root)}
        runs = ctx.instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        return [r for r in runs if r.tags.get("dagster/root_run_id", r.run_id) in roots]

    runs = ctx.wait_for(training_runs)
    if not runs:
        fault.detail = "no run was training"
        return
    run = rng.choice(sorted(runs, key=lambda r: r.run_id))
    pid = ctx.launcher.worker_pid(run)
    if pid is None or not alive(pid):
        fault.detail = f"run {run.run_id} had no live worker pid"
        return
    if not _send(pid, signal.SIGKILL, fault):
        return
    fault.injected, fault.unix = True, time.time()
    fault.target = {"model": run.tags.get("platform/model"), "run_id": run.run_id, "pid": pid,
                    "root_run_id": run.tags.get("dagster/root_run_id", run.run_id)}
    fault.detail = "run worker SIGKILLed while its training ran"


def store_errors(ctx, rng, fault: Fault) -> None:
    kind = rng.choice(["503", "500", "reset"])
    ctx.platform.lakefs.inject(kind, 2)
    fault.injected, fault.detail = True, f"the store's next 2 requests answered {kind}"


def store_down(ctx, rng, fault: Fault) -> None:
    down_s = rng.uniform(8.0, 30.0)
    ctx.platform.lakefs.inject("503", 1_000_000)
    fault.injected = True
    try:
        ctx.stop.wait(down_s)
    finally:
        ctx.platform.lakefs.proxy.clear()
    fault.detail = f"the store answered 503 to everything for {down_s:.0f} s"


def store_restart(ctx, rng, fault: Fault) -> None:
    down_s = rng.uniform(0.5, 3.0)
    ctx.platform.lakefs.proxy.outage(down_s)
    fault.injected, fault.detail = True, f"the store stopped listening for {down_s:.1f} s, open connections dropped"


def s3_stopped(ctx, rng, fault: Fault) -> None:
    down_s = 0.0 if rng.random() < 0.5 else rng.uniform(10.0, 40.0)
    platform = ctx.platform
    fault.injected = True
    platform.s3_outages += 1
    platform.s3_down = True
    try:
        platform.seaweed.stop()
        ctx.stop.wait(down_s)
    finally:
        platform.seaweed.start()  # on the same ports and data
        platform.s3_down = False
    fault.detail = ("SeaweedFS stopped and restarted at once" if not down_s
                    else f"SeaweedFS stopped for {down_s:.0f} s, then restarted")


def _limit_file_size(pid: int, limit: int, hold_s: float, stop: threading.Event) -> bool:
    """RLIMIT_FSIZE ``limit`` on ``pid`` (soft; the hard limit stays) for ``hold_s`` or until it
    ends; True when it ended meanwhile. Python ignores SIGXFSZ, so an over-long write fails with
    EFBIG ("File too large"), as on a full disk, instead of killing the process."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline and alive(pid) and not stop.is_set():
        time.sleep(0.2)
    if not alive(pid):
        return True
    try:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
    except ProcessLookupError:
        return True
    return False


def disk_full_checkpoint(ctx, rng, fault: Fault) -> None:
    """A training rank's file-size quota set below its checkpoint's size for up to 30 s: its
    next checkpoint write fails as on a full disk."""
    def with_checkpoint():
        found = []
        for r in training_ranks(ctx.data_root):
            files = [p for p in r.checkpoint_dir.glob("step_*/**/*") if p.is_file()] if r.checkpoint_dir.is_dir() else []
            sizes = []
            for p in files:
                try:
                    sizes.append(p.stat().st_size)
                except FileNotFoundError:
                    continue  # pruned meanwhile
            if sizes and (r.rank == 0 or any("dcp" in p.parts for p in files)):
                found.append((r, max(sizes)))
        return found

    found = ctx.wait_for(with_checkpoint)
    if not found:
        fault.detail = "no training with a checkpoint was running"
        return
    rank, largest = rng.choice(sorted(found, key=lambda f: f[0].pid))
    limit = max(4096, largest // 2)
    ended = _limit_file_size(rank.pid, limit, 30.0, ctx.stop)
    fault.injected, fault.target = True, rank.describe()
    fault.detail = (f"rank {rank.rank}'s file-size quota set to {limit} bytes (its checkpoint files reach {largest}); "
                    f"{'it ended under the quota' if ended else 'quota lifted after 30 s'}")


def disk_full_shards(ctx, rng, fault: Fault) -> None:
    """The platform's scratch volume (TMPDIR, where the shards asset builds its shards) filled up
    for 10 s while a run's shards step runs: every write there fails with ENOSPC, as on a full disk."""
    scratch = ctx.platform.scratch
    if scratch is None:
        fault.detail = f"no scratch volume to fill ({ctx.platform.scratch_refused})"
        return

    def in_shards_step():
        hits = []
        for run in ctx.instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            records = ctx.instance.get_records_for_run(run.run_id, of_type={
                dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS,
                dg.DagsterEventType.STEP_FAILURE}).records
            started = {r.event_log_entry.step_key for r in records
                       if r.event_log_entry.dagster_event_type == dg.DagsterEventType.STEP_START}
            ended = {r.event_log_entry.step_key for r in records
                     if r.event_log_entry.dagster_event_type != dg.DagsterEventType.STEP_START}
            # a shards asset is one step, or a graph of steps (<name>__shards.<name>__shards_plan, _shard_parts[...], _publish)
            if any(k and "__shards" in k for k in started - ended):
                hits.append(run)
        return hits

    runs = ctx.wait_for(in_shards_step, poll_s=0.2)
    if not runs:
        fault.detail = "no run was writing shards"
        return
    run = rng.choice(sorted(runs, key=lambda r: r.run_id))
    hold_s = 10.0
    fault.injected, fault.unix = True, time.time()
    fault.target = {"model": run.tags.get("platform/model"), "run_id": run.run_id,
                    "root_run_id": run.tags.get("dagster/root_run_id", run.run_id)}
    filled = fill(scratch, hold_s, ctx.stop)
    fault.detail = f"the scratch volume (TMPDIR) filled ({filled // 1024} KiB of ballast) for {hold_s:.0f} s during a shards step"


def fill(volume: Path, hold_s: float, stop: threading.Event) -> int:
    """Fill ``volume`` to the last block for ``hold_s``, then free it; the bytes it took."""
    ballast = volume / ".soak-ballast"
    stats = os.statvfs(volume)
    with open(ballast, "wb", buffering=0) as f:
        try:
            os.posix_fallocate(f.fileno(), 0, stats.f_bavail * stats.f_frsize)
        except OSError:
            pass  # no fallocate here, or not all of it: written below
        f.seek(0, os.SEEK_END)
        for size in (1 << 20, 1 << 12, 1):  # what is left, to the last byte
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError:
                    break
        taken = f.tell()
    try:
        stop.wait(hold_s)
    finally:
        ballast.unlink()
    return taken


def rank_hang(ctx, rng, fault: Fault) -> None:
    """A rank of a two-rank training SIGSTOPped: its peer's hang watchdog must fail the attempt
    (hang_timeout_s), after which the stopped process is ended and the training resumed."""
    rank = _pick_rank(ctx, rng, lambda r: r.world_size >= 2)
    if rank is None:
        fault.detail = "no training of two or more ranks was running"
        return
    if not _send(rank.pid, signal.SIGSTOP, fault):
        return
    fault.injected, fault.target = True, rank.describe()
    bound_s = HANG_TIMEOUT_S + COLLECTIVE_TIMEOUT_S + 60.0
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and alive(rank.pid):
        time.sleep(0.5)
    if alive(rank.pid):
        os.kill(rank.pid, signal.SIGKILL)
        fault.violation = (f"rank {rank.rank} (pid {rank.pid}) was still stopped {bound_s:.0f} s after SIGSTOP: nothing "
                       "ended the hung attempt; the soak SIGKILLed it")
    fault.detail = f"rank {rank.rank} of {rank.world_size} SIGSTOPped"


def nonfinite_loss(ctx, rng, fault: Fault) -> None:
    """A run started through the webserver with a learning rate that overflows: it must fail at
    once, naming the non-finite loss, without a retry."""
    model = rng.choice(sorted(JOBS))
    config = {"ops": {f"{model}__checkpoint": {"ops": {f"{model}_distributed_training": {
        "config": {"train": {"lr": NAN_LR}}}}}}}
    run_id = submit(ctx.client, model, run_config=config)
    fault.injected = True
    fault.target = {"model": model, "run_id": run_id, "root_run_id": run_id}
    fault.detail = f"a {model} run submitted with train.lr={NAN_LR:g}"


def pod_deleted(ctx, rng, fault: Fault) -> None:
    pods = ctx.wait_for(lambda: pod_groups(ctx.data_root))
    if not pods:
        fault.detail = "no training pod was running"
        return
    name = rng.choice(sorted(pods))
    pgid, node = pods[name]
    if not _send(pgid, signal.SIGTERM, fault, group=True):
        return
    fault.injected, fault.target = True, {"pod": name, "node": node, "pgid": pgid, **_pod_run(ctx, name)}
    fault.detail = f"pod {name} deleted (SIGTERM to its processes)"


def node_lost(ctx, rng, fault: Fault) -> None:
    pods = ctx.wait_for(lambda: pod_groups(ctx.data_root))
    if not pods:
        fault.detail = "no training pod was running"
        return
    node = rng.choice(sorted({n for _, n in pods.values()}))
    lost = sorted(name for name, (_, n) in pods.items() if n == node)
    runs = [_pod_run(ctx, name) for name in lost]
    for name in lost:
        try:
            os.killpg(pods[name][0], signal.SIGKILL)
        except ProcessLookupError:
            continue
    fault.injected, fault.target = True, {"node": node, "pods": lost, **(runs[0] if runs else {})}
    fault.detail = f"node {node} lost: {len(lost)} pod(s) SIGKILLed"


def _pod_run(ctx, pod: str) -> dict:
    ranks = [r for r in training_ranks(ctx.data_root) if r.pod == pod]
    return {"model": ranks[0].model, "root_run_id": ranks[0].root_run_id} if ranks else {}


# --- an elastic gang's node ------------------------------------------------------------------------
ELASTIC_WAIT_S = 420.0  # how long the injector waits for the hit training's run to end
# A gang that lost a node grows back once the replacement pod (cluster.ELASTIC_REPLACEMENT_S after
# the loss) has started and joined: torchrun's start, the survivors' restart with a checkpoint and
# the rendezvous' last call. A training that went on this long after the loss must have grown back.
REJOIN_WITHIN_S = 90.0


def pod_agent(rank: Rank) -> int | None:
    """The pid of the torchrun agent that started ``rank``: a pod's main process (the workers run
    in sessions of their own, so the pod is the agent's whole process tree, as its cgroup is)."""
    try:
        proc = psutil.Process(rank.pid).parent()
        while proc is not None:
            if any("torch.distributed.run" in a or a.endswith("torchrun") for a in proc.cmdline()):
                return proc.pid
            proc = proc.parent()
    except psutil.Error:
        return None
    return None


def elastic_ranks(ctx, want: Callable[[Rank], bool] = lambda r: True) -> list[Rank]:
    """Ranks of elastic gangs that run above min_nodes (one rank a pod in the soak) and have
    published a checkpoint (they are training, not starting), for which ``want`` holds."""
    found = []
    for r in training_ranks(ctx.data_root):
        if r.elastic is None or r.world_size <= r.elastic[0] or not want(r):
            continue
        if r.checkpoint_dir.is_dir() and any(r.checkpoint_dir.glob("step_*")):
            found.append(r)
    return found


def _hit_run(ctx, rank: Rank) -> str | None:
    """The run (of ``rank``'s root run) that is training now."""
    runs = ctx.instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    hits = [r.run_id for r in runs if r.tags.get("dagster/root_run_id", r.run_id) == rank.root_run_id]
    return hits[-1] if hits else None


def lose_pod(rank: Rank, sig: int, fault: Fault) -> bool:
    """Every process of ``rank``'s pod signalled: SIGKILL is its node vanishing, SIGTERM its
    deletion with notice (the kubelet's; a rank told to stop checkpoints first)."""
    agent = pod_agent(rank)
    if agent is None:
        fault.detail = f"rank {rank.rank} (pid {rank.pid}) had no torchrun agent left: its pod was ending"
        return False
    tree = process_tree(agent)
    if not _send(agent, sig, fault):
        return False
    for pid in tree[1:]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
    return True


def _inject_elastic_loss(ctx, fault: Fault, rank: Rank, sig: int, how: str) -> None:
    run_id = _hit_run(ctx, rank)
    if not lose_pod(rank, sig, fault):
        return
    fault.injected, fault.unix = True, time.time()
    fault.target = {**rank.describe(), "run_id": run_id}
    fault.detail = f"pod {rank.pod} ({how}) of a gang of {rank.world_size} pods, min_nodes {rank.elastic[0]}"
    judge_elastic(ctx, fault, rank, run_id)


def elastic_node_lost(ctx, rng, fault: Fault) -> None:
    """A node of an elastic gang above min_nodes lost without notice (its pod's processes
    SIGKILLed): the others go on smaller from the last checkpoint, in the same run, and the Job's
    replacement pod joins them when it comes."""
    ranks = ctx.wait_for(lambda: elastic_ranks(ctx))
    if not ranks:
        fault.detail = "no elastic gang above min_nodes was training"
        return
    rank = rng.choice(sorted(ranks, key=lambda r: r.pid))
    _inject_elastic_loss(ctx, fault, rank, signal.SIGKILL, "its node lost: SIGKILL")


def elastic_node_rejoin(ctx, rng, fault: Fault) -> None:
    """A pod of an elastic gang deleted with notice (preempted: SIGTERM to its processes, every
    rank checkpoints), early in its training, so that the Job's replacement rejoins the running
    gang: judged on the gang growing back to its size before the loss."""
    ranks = ctx.wait_for(lambda: elastic_ranks(ctx))
    if not ranks:
        fault.detail = "no elastic gang above min_nodes was training"
        return
    rank = rng.choice(sorted(ranks, key=lambda r: r.pid))
    _inject_elastic_loss(ctx, fault, rank, signal.SIGTERM, "deleted with notice: SIGTERM")


def elastic_node_lost_in_checkpoint_write(ctx, rng, fault: Fault) -> None:
    """The node of the rank writing an elastic gang's checkpoint lost (its pod's processes
    SIGKILLed) the moment a ``.tmp-`` folder appears: the half-written checkpoint is never
    listed, and the others resume from the last published one."""
    root = ctx.data_root / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + TARGET_WAIT_S
    writers: dict[Path, list[Rank]] = {}
    refreshed = 0.0
    with NewEntries(root) as watch:
        while time.monotonic() < deadline and not ctx.stop.is_set():
            if time.monotonic() - refreshed > 1.0:
                writers = {}
                for r in elastic_ranks(ctx):
                    writers.setdefault(r.checkpoint_dir, []).append(r)
                refreshed = time.monotonic()
            seen = watch.next(timeout_s=0.5)
            if seen is None or not seen[1].startswith(".tmp-"):
                continue
            folder, name = seen
            candidates = [r for r in writers.get(folder, []) if r.rank == 0 or name.endswith("-sharded")]
            if not candidates:
                continue
            victim = rng.choice(sorted(candidates, key=lambda r: r.rank))
            still_writing = (folder / name).exists()
            _inject_elastic_loss(ctx, fault, victim, signal.SIGKILL,
                                 f"its node lost as {name} began to be written"
                                 + ("" if still_writing else ", the write may just have finished"))
            return
    fault.detail = f"no elastic gang above min_nodes began a checkpoint write within {TARGET_WAIT_S:.0f} s"


def judge_elastic(ctx, fault: Fault, rank: Rank, run_id: str | None) -> None:
    """Wait for the hit run to end, then judge the gang by its metrics.json (elastic_verdict)."""
    deadline = time.monotonic() + ELASTIC_WAIT_S
    run = None
    while time.monotonic() < deadline:
        run = ctx.instance.get_run_by_id(run_id) if run_id else None
        if run is None or run.is_finished:
            break
        time.sleep(2.0)
    status = None if run is None else run.status.value
    metrics_path = rank.output_dir / "metrics.json" if rank.output_dir else None
    metrics = resolved = None
    ended_at = None
    if metrics_path is not None and metrics_path.is_file() and metrics_path.stat().st_mtime >= fault.unix:
        metrics = json.loads(metrics_path.read_text())
        resolved = json.loads((metrics_path.parent / "resolved_config.json").read_text())
        ended_at = metrics_path.stat().st_mtime
    problem, rejoined, note = elastic_verdict(fault.cls, status, metrics, resolved, lost_at=fault.unix,
                                              ended_at=ended_at, size=rank.world_size)
    fault.detail += f"; {note}" if note else ""
    # For the report: the hit training's world size at each attempt, and whether it grew back.
    fault.target.update(run_status=status, grew_back=rejoined,
                        world_sizes=[a.get("world_size") for a in metrics["attempts"]] if metrics else None)
    if problem:
        fault.violation = problem
    elif fault.cls == "elastic_node_rejoin" and not rejoined:
        # The loss happened, the rejoin this class is about could not: drawn again.
        fault.injected = False


def elastic_verdict(cls: str, status: str | None, metrics: dict | None, resolved: dict | None, *,
                    lost_at: float, ended_at: float | None, size: int) -> tuple[str | None, bool, str]:
    """(what the platform failed to do, or None; whether the gang grew back; what happened) for a
    gang of ``size`` that lost a node at ``lost_at`` (unix): the same run ends in success with
    every optimizer step trained (a run that failed lost the training: the loss was above
    min_nodes), having gone on smaller after the loss; and, when it trained on REJOIN_WITHIN_S
    after the loss, having grown back to ``size``."""
    if status is None:
        return None, False, "the run had ended before the loss could be judged"
    if status != "SUCCESS":
        return (f"the gang did not go on after losing a node above min_nodes: its run ended {status}", False,
                f"run {status}")
    if metrics is None:
        return "the run succeeded but its training wrote no metrics.json after the loss", False, "no metrics"
    attempts = [a.get("world_size") for a in metrics.get("attempts", [])]
    if metrics.get("steps") != resolved.get("total_steps"):
        return (f"the training ended at step {metrics.get('steps')} of {resolved.get('total_steps')}", False,
                f"attempts at world sizes {attempts}")
    after = [r for r in metrics.get("resizes", []) if (r.get("at") or 0) >= lost_at - 1.0]
    shrank = [r for r in after if r["to_world_size"] < r["from_world_size"]]
    if not shrank:
        return (f"no resize below {size} ranks was recorded after the loss (attempts at world sizes {attempts})",
                False, "")
    grew = [r for r in after if r["at"] >= shrank[0]["at"] and r["to_world_size"] == size]
    went_on = ended_at - lost_at if ended_at else 0.0
    note = (f"the gang went on at {shrank[0]['to_world_size']} from step {shrank[0]['resumed_from_step']}"
            + (f", grew back to {size} from step {grew[0]['resumed_from_step']}" if grew else
               f", and ended {went_on:.0f} s after the loss, before its replacement joined")
            + f"; attempts at world sizes {attempts}")
    if not grew and went_on > REJOIN_WITHIN_S:
        return (f"the gang trained on {went_on:.0f} s after losing a node without growing back to {size} ranks "
                f"(attempts at world sizes {attempts})", False, note)
    return None, bool(grew), note


INJECT: dict[str, Callable] = {
    "worker_kill": worker_kill, "worker_kill_in_checkpoint_write": worker_kill_in_checkpoint_write,
    "run_worker_kill": run_worker_kill, "store_errors": store_errors, "store_down": store_down,
    "store_restart": store_restart, "s3_stopped": s3_stopped, "disk_full_checkpoint": disk_full_checkpoint,
    "disk_full_shards": disk_full_shards, "rank_hang": rank_hang, "nonfinite_loss": nonfinite_loss,
    "pod_deleted": pod_deleted, "node_lost": node_lost, "elastic_node_lost": elastic_node_lost,
    "elastic_node_rejoin": elastic_node_rejoin,
    "elastic_node_lost_in_checkpoint_write": elastic_node_lost_in_checkpoint_write,
}


class FaultPlan:
    """Classes in seeded random rounds: each round is every class once in a shuffled order, the
    classes the last round could not inject first."""

    def __init__(self, classes: list[str], rng: random.Random):
        self.classes = sorted(classes)
        self.rng = rng
        self._round: list[str] = []
        self._owed: list[str] = []

    def next(self) -> str:
        if not self._round:
            rest = [c for c in self.classes if c not in self._owed]
            self.rng.shuffle(rest)
            self._round, self._owed = [*self._owed, *rest], []
        return self._round.pop(0)

    def owe(self, cls: str) -> None:
        if cls not in self._owed:
            self._owed.append(cls)


@dataclass
class FaultScheduler:
    ctx: FaultContext
    classes: list[str]
    seed: int
    gap_s: tuple[float, float]
    faults: list[Fault] = field(default_factory=list)

    def run(self) -> None:
        # The plan (classes and gaps) and each fault's own choices draw from generators of their
        # own, so a replay's n-th fault makes the same choices whatever the earlier ones found.
        plan_rng = random.Random(f"{self.seed}:plan")
        plan = FaultPlan(self.classes, plan_rng)
        while not self.ctx.stop.wait(plan_rng.uniform(*self.gap_s)):
            cls = plan.next()
            fault = Fault(cls=cls, at=self.ctx.clock.now())
            self.faults.append(fault)
            try:
                INJECT[cls](self.ctx, random.Random(f"{self.seed}:fault:{len(self.faults)}"), fault)
            except Exception:  # noqa: BLE001 - the injector's own failure is reported as a soak error
                fault.error = traceback.format_exc()[-2000:]
            fault.ended = self.ctx.clock.now()
            if not fault.injected and self.ctx.stop.is_set():
                fault.cut_short = True
                fault.detail += " (cut short: the load ended while it waited)"
            elif not fault.injected:
                plan.owe(cls)
