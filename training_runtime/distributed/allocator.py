"""The host allocator settings a training's workers start with (torch-free: the launchers import
it, locally and when they build a pod).

glibc's malloc serves a request below its mmap threshold from the heap, and raises that
threshold (up to 32 MB on 64-bit) each time a larger mmapped block is freed. Freed heap blocks
stay in the process: RSS keeps buffers FSDP has already freed (the all-gathered parameters of a
unit after its forward, the reduce-scatter inputs after its backward). A user measured FSDP at
0.97x DDP's per-rank peak RSS with glibc's defaults and 0.54x with
``MALLOC_MMAP_THRESHOLD_=1048576``. A fixed threshold of 1 MB serves every tensor of a MB or
more by mmap, returned to the kernel on free, and turns the self-raising threshold off.

The cost is a page fault per fresh page of every such tensor, each step: on CPU (gloo) training
with large activations a step takes longer. DDP keeps everything alive for the whole step and
gains nothing from it, so the setting is given only under FSDP/HSDP, where lower memory is the
point. glibc reads it when the process starts, hence an environment variable set by the
launcher, not a call in the worker. A value the user's environment (or the job's ``env``)
already sets wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FSDP_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def allocator_env(config: Mapping[str, Any], environ: Mapping[str, str] = {}) -> dict[str, str]:
    """The allocator variables for a training of runtime ``config`` (its ``train.sharding``),
    less those ``environ`` (the user's environment) already sets."""
    sharding = (config.get("train") or {}).get("sharding", "ddp")
    if sharding not in ("fsdp", "hsdp"):
        return {}
    return {k: v for k, v in FSDP_ALLOCATOR_ENV.items() if k not in environ}
