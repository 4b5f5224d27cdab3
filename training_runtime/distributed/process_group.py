"""The process group of a training: which device each rank takes, init and teardown (NCCL bound to the
rank's GPU, a gloo side group for waits on one rank's I/O), and the object collectives."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class DeviceError(RuntimeError):
    """The requested device cannot be used; the message says why and what to change."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    local_world_size: int = 1
    # A gloo group with a long timeout for waits on one rank's I/O (shard download and check,
    # checkpoint verification, synchronous saves); None: the default group.
    io_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot use CUDA here, or None when it can. ``torch.cuda.is_available()`` only says
    False; initialising CUDA raises with the driver's own reason."""
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support (a CPU wheel)"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "CUDA_VISIBLE_DEVICES is empty, so no GPU is visible to this process"
    try:
        torch.cuda.init()
    except Exception as e:  # the driver's message: too old, no device, no device plugin ...
        return f"CUDA failed to initialise: {e}"
    if torch.cuda.device_count() == 0:
        return "CUDA initialised but reports no device"
    return None


def choose_device(requested: str, *, local_rank: int, local_world_size: int, unavailable: str | None,
                  device_count: int) -> torch.device:
    """The device of local rank ``local_rank``. 'cuda' requires a usable GPU for every local rank:
    a pod whose CUDA fails silently training on CPU with gloo would waste the GPUs it holds.
    'auto' takes CUDA when it works. ``unavailable``: ``cuda_unavailable_reason()``."""
    if requested not in ("auto", "cuda", "cpu"):
        raise ValueError(f"train.device must be 'auto', 'cuda' or 'cpu', got {requested!r}")
    if requested == "cpu" or (requested == "auto" and unavailable is not None):
        return torch.device("cpu")
    if unavailable is not None:
        raise DeviceError(f"train.device is 'cuda' (the job requested GPUs) but {unavailable}; check the "
                          "node's NVIDIA driver and device plugin and that the pod requests the GPU "
                          "resource, or train with train.device 'cpu' (recipe gpus_per_node 0)")
    if local_rank >= device_count or local_world_size > device_count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise DeviceError(f"{local_world_size} rank(s) per node need one GPU each, but this host shows "
                          f"{device_count} GPU(s){shown}, so local rank {local_rank} has no GPU; set the "
                          f"recipe's gpus_per_node (ranks per node) to at most {device_count} or request "
                          "more GPUs per node")
    return torch.device("cuda", local_rank)


def init_distributed(device: str = "auto", timeout_s: float = 600.0, io_timeout_s: float = 3600.0) -> DistInfo:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, ...). Without
    torchrun the process is a world of one. NCCL on CUDA, gloo on CPU; ``timeout_s`` bounds every
    training collective so a dead peer fails the run instead of blocking it, and a gloo side group
    with ``io_timeout_s`` carries the waits on one rank's I/O."""
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if launched else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if launched else 1
    unavailable = None if device == "cpu" else cuda_unavailable_reason()
    dev = choose_device(device, local_rank=local_rank, local_world_size=local_world, unavailable=unavailable,
                        device_count=0 if unavailable else torch.cuda.device_count())
    backend = "nccl" if dev.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    # device_id binds the NCCL communicator to this rank's GPU at init (no guessing from the
    # current device, and the first collective does not pay for the communicator's creation).
    extra = {"device_id": dev} if dev.type == "cuda" else {}
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if launched:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        with _joining_deadline(timeout_s + JOIN_MARGIN_S, rank):
            dist.init_process_group(backend, store=_attempt_store(world, timeout), rank=rank,
                                    world_size=world, timeout=timeout, **extra)
            io_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=io_timeout_s))
    else:
        rank, world = 0, 1
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **extra)
        io_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=io_timeout_s))
    return DistInfo(rank, local_rank, world, dev, backend, local_world, io_group)


JOIN_MARGIN_S = 10.0


@contextlib.contextmanager
def _joining_deadline(seconds: float, rank: int) -> Iterator[None]:
    """Ends the process (exit 1, a retryable failure: torchrun restarts the gang) when joining
    the process group takes longer than ``seconds``. A TCPStore client connecting to a store
    whose host process is stopped (a hung rank 0 hosting a multi-node attempt's store) waits
    past its own timeout: torch logs "waitForInput ... timed out" and keeps waiting. The hang
    watchdog only starts with training, so without this a peer of a rank hung in start-up would
    wait for ever."""
    def expire() -> None:
        print(f"[rank{rank}] joining the process group took over {seconds:g} s (train.collective_timeout_s "
              "plus a margin): a peer, or the store rank 0 hosts, is stalled or gone. Stacks follow; the "
              "attempt fails and torchrun restarts the gang", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _attempt_store(world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store of this attempt's workers.

    On one node torchrun's agent shares one TCPStore with its workers across restarts
    (TORCHELASTIC_USE_AGENT_STORE) without a per-attempt prefix, so a restarted worker can read a
    dead worker's gloo address and fail with 'connectFullMesh ... Connection refused': its keys are
    namespaced by the restart count. That count is each agent's own (pytorch/pytorch#108158,
    #135712): only the agent whose worker failed increments it, the others restart theirs for the
    membership change without counting, so the ranks of a restarted multi-node gang would wait
    under different prefixes and never meet. Multi-node pods therefore turn the sharing off
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, resources/k8s/manifests.py): each rendezvous round then
    hands rank 0 a fresh port, where it hosts a new store with nothing stale in it and no count to
    agree on."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"training_runtime/attempt_{attempt}", store)
    # Plain env:// semantics: rank 0 hosts this attempt's own store.
    return dist.TCPStore(addr, port, world_size, is_master=int(os.environ["RANK"]) == 0, timeout=timeout,
                         multi_tenant=True)


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def raise_if_any_failed(error: BaseException | None, what: str, group: Any = None) -> None:
    """Collective: every rank raises when any rank failed, so none hangs in a later collective.
    ``group``: the I/O group when the other ranks waited here on one rank's I/O."""
    msgs = all_gather_object(None if error is None else f"{type(error).__name__}: {error}", group)
    failed = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if error is not None:
        raise error
    if failed:
        r, m = failed[0]
        raise RuntimeError(f"{what} failed on rank {r}: {m}")
