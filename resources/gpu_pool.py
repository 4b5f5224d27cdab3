"""GPU capacity shared between trainings, held in the Dagster instance's concurrency pools.

Dagster pools count one slot per step (or per run); they cannot weigh a step by its GPU count.
The training step therefore claims N slots of the pool "gpu" itself, all or nothing, in the same
instance table Dagster's pools use: the pool's limit is the cluster's GPU count
(`concurrency: pools: default_limit` in dagster.yaml, or `dagster instance concurrency set gpu N`),
a job needing N GPUs holds N units while it trains, and others wait until enough are free.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import dagster as dg

GPU_POOL = "gpu"

@contextmanager
def gpu_units(instance: dg.DagsterInstance, run_id: str, step: str, units: int, *, log=None,
              pool: str = GPU_POOL, poll_interval_s: float = 5.0) -> Iterator[None]:
    """Hold ``units`` slots of ``pool`` while the block runs; wait (polling) until they are free."""
    if units <= 0:
        yield
        return
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        raise dg.Failure(description=f"this instance's storage cannot hold concurrency pools, so {units} GPU "
                                     "unit(s) cannot be reserved; use SQLite or PostgreSQL storage", allow_retries=False)
    limit = gpu_capacity(instance, pool)
    if units > limit:
        raise dg.Failure(description=f"{step} needs {units} GPU units but pool {pool!r} has {limit}; lower "
                                     "recipe.gpus_per_node/nnodes or raise the pool's limit", allow_retries=False)
    keys = [f"{step}[gpu{i}]" for i in range(units)]
    waited = False
    while not _claim_all(storage, pool, run_id, keys):
        if log and not waited:
            log.info(f"{step} waits for {units} free GPU unit(s) of {limit} in pool {pool!r}")
        waited = True
        time.sleep(poll_interval_s)
    try:
        yield
    finally:
        for key in keys:
            storage.free_concurrency_slot_for_step(run_id, key)


def gpu_capacity(instance: dg.DagsterInstance, pool: str = GPU_POOL) -> int:
    storage = instance.event_log_storage
    if pool not in storage.get_concurrency_keys():
        storage.initialize_concurrency_limit_to_default(pool)
    if pool not in storage.get_concurrency_keys():
        raise dg.Failure(description=f"pool {pool!r} has no limit; set `concurrency: pools: default_limit: <GPUs>` in "
                                     f"dagster.yaml or run `dagster instance concurrency set {pool} <GPUs>`",
                         allow_retries=False)
    return storage.get_concurrency_info(pool).slot_count


def _claim_all(storage, pool: str, run_id: str, keys: list[str]) -> bool:
    for key in keys:
        if not storage.claim_concurrency_slot(pool, run_id, key).is_claimed:
            for k in keys:  # all or nothing: two half-served jobs must not block each other
                storage.free_concurrency_slot_for_step(run_id, k)
            return False
    return True
