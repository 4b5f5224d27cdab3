"""Wrapping a model for data parallelism (DDP, FSDP2, HSDP) and moving its full state in and out, in the
format of torch.distributed.checkpoint's full-state helpers so DDP and FSDP runs resume each other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from training_runtime.config import ConfigError
from training_runtime.distributed.process_group import DistInfo
from training_runtime.distributed.units import BUILTIN_MODULE, fsdp_units

SHARDED = ("fsdp", "hsdp")


def is_sharded(sharding: str) -> bool:
    return sharding in SHARDED


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


def wrap_model(model: nn.Module, sharding: str, info: DistInfo, *, precision: str = "fp32",
               units: Sequence[str] = (), unit_params: int | None = None,
               activation_checkpointing: bool = False) -> nn.Module:
    """The model on its device, wrapped for ``sharding``. Under FSDP/HSDP each unit
    (``distributed.units.fsdp_units``: the classes named in ``units``, the platform's blocks, or
    modules of about ``unit_params`` parameters) is sharded on its own, then the root.
    ``activation_checkpointing`` recomputes each unit's forward in the backward pass instead of
    keeping its activations (under DDP too), through the composable ``checkpoint``, which keeps
    parameter names and so checkpoints as they are."""
    model.to(info.device)
    chosen = fsdp_units(model, units, unit_params) if is_sharded(sharding) or activation_checkpointing else []
    if activation_checkpointing:
        if not chosen:
            raise ConfigError("train.activation_checkpointing recomputes each FSDP unit's activations, but this "
                              "model has no units besides the root: name its blocks in train.fsdp_units "
                              "(recipe.fsdp_units) or lower train.fsdp_unit_params")
        from torch.distributed._composable import checkpoint

        for sub in chosen:
            checkpoint(sub)
    if is_sharded(sharding):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        shape = fsdp_mesh_shape(sharding, info.world_size, info.local_world_size)
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
        mesh = init_device_mesh(info.device.type, shape, mesh_dim_names=names)
        inner = mixed_precision_policy(precision, root=False)
        outer = mixed_precision_policy(precision)
        for sub in chosen:  # inner units first, as fully_shard needs
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


# ---------------------------------------------------------------- what the wrapping did
def wrapping_summary(model: nn.Module, sharding: str, units: Sequence[str] = (), unit_params: int | None = None,
                     activation_checkpointing: bool = False) -> dict[str, Any]:
    """What ``wrap_model`` does to ``model`` (before it is wrapped), for the run's log, its
    resolved_config.json and the lineage's training row: the sharding, FSDP's units (how many,
    of which classes, chosen how) and activation checkpointing."""
    out: dict[str, Any] = {"sharding": sharding, "activation_checkpointing": activation_checkpointing}
    if is_sharded(sharding):
        chosen = fsdp_units(model, units, unit_params)
        classes: dict[str, int] = {}
        for m in chosen:
            classes[type(m).__name__] = classes.get(type(m).__name__, 0) + 1
        policy = ("by class name" if units else "the platform's blocks" if type(model).__module__ == BUILTIN_MODULE
                  else "by size")
        out.update(units=len(chosen), unit_classes=dict(sorted(classes.items())), unit_policy=policy)
    return out


def describe_wrapping(summary: dict[str, Any]) -> str:
    """``wrapping_summary`` in words, e.g. 'sharding fsdp, 24 units (Linear x24, by size),
    activation checkpointing off'."""
    parts = [f"sharding {summary['sharding']}"]
    if "units" in summary:
        classes = ", ".join(f"{k} x{v}" for k, v in summary["unit_classes"].items())
        parts.append(f"{summary['units']} FSDP units ({classes}; {summary['unit_policy']})" if summary["units"]
                     else f"no FSDP units besides the root ({summary['unit_policy']}): every rank holds every "
                          "parameter in full during the forward and backward")
    parts.append(f"activation checkpointing {'on' if summary['activation_checkpointing'] else 'off'}")
    return ", ".join(parts)
