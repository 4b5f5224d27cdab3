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


SHARDED = ("fsdp", "hsdp")


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


def is_sharded(sharding: str) -> bool:
    return sharding in SHARDED


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
        dist.init_process_group(backend, store=_attempt_store(world, timeout), rank=rank,
                                world_size=world, timeout=timeout, **extra)
    else:
        rank, world = 0, 1
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **extra)
    io_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=io_timeout_s))
    return DistInfo(rank, local_rank, world, dev, backend, local_world, io_group)


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


def fsdp_mesh_shape(sharding: str, world_size: int, local_world_size: int) -> tuple[int, ...]:
    """FSDP's device mesh: one dimension over every rank, or for HSDP (replicate, shard) with the
    shard dimension within a node, so parameter all-gathers and gradient reduce-scatters stay on
    the node's NVLink and only the gradient all-reduce between replicas crosses the network."""
    if sharding == "fsdp":
        return (world_size,)
    if sharding == "hsdp":
        if local_world_size < 1 or world_size % local_world_size:
            raise ValueError(f"train.sharding 'hsdp' needs the same number of ranks on every node; world size "
                             f"{world_size} is not a multiple of {local_world_size} ranks per node")
        return (world_size // local_world_size, local_world_size)
    raise ValueError(f"train.sharding {sharding!r} has no FSDP mesh")


def mixed_precision_policy(precision: str, *, root: bool = True):
    """FSDP2's bf16 policy: parameters all-gathered and computed in bf16 (half the all-gather
    bytes, no per-forward re-cast as under autocast), gradients reduced in fp32; the optimizer
    keeps fp32 sharded master weights. The root hands its outputs back in fp32 so losses and
    metrics are computed at full precision; inner units pass bf16 on (an fp32 activation meeting
    the root's bf16 norm weights would be a mixed-dtype error). None for fp32."""
    if precision != "bf16":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if root else None)


def wrap_model(model: nn.Module, sharding: str, info: DistInfo, *, precision: str = "fp32") -> nn.Module:
    model.to(info.device)
    if is_sharded(sharding):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        shape = fsdp_mesh_shape(sharding, info.world_size, info.local_world_size)
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
        mesh = init_device_mesh(info.device.type, shape, mesh_dim_names=names)
        inner = mixed_precision_policy(precision, root=False)
        outer = mixed_precision_policy(precision)
        for sub in shardable_submodules(model):
            fully_shard(sub, mesh=mesh, **({"mp_policy": inner} if inner else {}))
        fully_shard(model, mesh=mesh, **({"mp_policy": outer} if outer else {}))
        return model
    if sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    raise ValueError(f"train.sharding must be 'ddp', 'fsdp' or 'hsdp', got {sharding!r}")


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
    if is_sharded(sharding):
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
    if is_sharded(sharding):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=_dcp_options(cpu_offload=True))
    sd = optimizer.state_dict()
    name = _index_to_name(model, optimizer)
    return {"state": {name[i]: s for i, s in sd["state"].items()},
            "param_groups": [{**g, "params": [name[i] for i in g["params"]]} for g in sd["param_groups"]]}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
                    optim_state: dict[str, Any], sharding: str) -> None:
    """Load full state (as written by the two functions above) into a DDP or FSDP model."""
    if is_sharded(sharding):
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
