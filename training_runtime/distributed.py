"""Process group setup and model wrapping (DDP or FSDP2)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .models import shardable_submodules


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, ...). Without
    torchrun the process is a world of one. NCCL when CUDA is present, gloo otherwise."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, store=_attempt_store(world, timeout), rank=rank,
                                world_size=world, timeout=timeout)
    else:
        rank, world, local_rank = 0, 1, 0
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return DistInfo(rank, local_rank, world, device, backend)


def _attempt_store(world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store, namespaced by torchrun's restart count. torchrun's agent keeps one
    shared TCPStore across restarts without a per-attempt prefix, so a restarted worker can read a
    dead worker's gloo address and fail with 'connectFullMesh ... Connection refused'."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
    else:  # plain env:// semantics: rank 0 hosts the store
        store = dist.TCPStore(addr, port, world_size, is_master=int(os.environ["RANK"]) == 0,
                              timeout=timeout, multi_tenant=True)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"training_runtime/attempt_{attempt}", store)


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_object(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def raise_if_any_failed(error: BaseException | None, what: str) -> None:
    """Collective: every rank raises when any rank failed, so none hangs in a later collective."""
    msgs = all_gather_object(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if error is not None:
        raise error
    if failed:
        r, m = failed[0]
        raise RuntimeError(f"{what} failed on rank {r}: {m}")


def wrap_model(model: nn.Module, sharding: str, info: DistInfo) -> nn.Module:
    model.to(info.device)
    if sharding == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(info.device.type, (info.world_size,))
        for sub in shardable_submodules(model):
            fully_shard(sub, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    raise ValueError(f"train.sharding must be 'ddp' or 'fsdp', got {sharding!r}")


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model
