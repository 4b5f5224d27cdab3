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


# ---------------------------------------------------------------- full (unsharded) state
# Checkpoints hold full state keyed by parameter name, in the format of torch.distributed.checkpoint
# .state_dict's full_state_dict helpers, so DDP and FSDP runs can resume from each other. The DDP path
# builds it from the plain state dicts: importing the DCP helpers costs seconds at start-up.
def _dcp_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model: nn.Module, sharding: str) -> dict[str, Any]:
    """Collective for FSDP. Full parameters on rank 0 (FSDP: on CPU, other ranks get {})."""
    if sharding == "fsdp":
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model, options=_dcp_options(cpu_offload=True))
    return dict(unwrap(model).state_dict())


def _index_to_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    out, i = {}, 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            out[i] = names[id(p)]
            i += 1
    return out


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, sharding: str) -> dict[str, Any]:
    """Optimizer state keyed by parameter name ({"state": {name: ...}, "param_groups": [...]})."""
    if sharding == "fsdp":
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=_dcp_options(cpu_offload=True))
    sd = optimizer.state_dict()
    name = _index_to_name(model, optimizer)
    return {"state": {name[i]: s for i, s in sd["state"].items()},
            "param_groups": [{**g, "params": [name[i] for i in g["params"]]} for g in sd["param_groups"]]}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
                    optim_state: dict[str, Any], sharding: str) -> None:
    """Load full state (as written by the two functions above) into a DDP or FSDP model."""
    if sharding == "fsdp":
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(model, model_state, options=_dcp_options())
        set_optimizer_state_dict(model, optimizer, optim_state, options=_dcp_options())
        return
    unwrap(model).load_state_dict(model_state)
    index = {n: i for i, n in _index_to_name(model, optimizer).items()}
    missing = set(index) - set(n for g in optim_state["param_groups"] for n in g["params"])
    if missing:
        raise ValueError(f"checkpoint optimizer state lacks parameters {sorted(missing)}")
    optimizer.load_state_dict({
        "state": {index[n]: s for n, s in optim_state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                         for g in optim_state["param_groups"]]})
