"""``TrainingContext``: what a training function gets on every rank, the built-in trainer included
(one path, not two). Field by field:

- ``rank``, ``world_size``, ``local_rank``, ``device``; ``config`` (the validated ``RunConfig``),
  ``data_info`` (what the shards hold), ``task`` (loss, metrics, predictions), ``model_build``
  (the factory and arguments the data implies).
- ``steps_per_epoch``, ``total_steps``, ``local_batch_size``: the schedule the config implies.
- ``epochs(start_step)``: ``(epoch, batches)`` over the training split from a step on, this
  rank's share, shuffled per epoch by the seed, augmented (images) by (seed, epoch, sample), with
  the next epoch prefetched; batches are ``{"input", "target"}`` dicts on ``device``. The epoch's
  order does not depend on the world size (``data.partitions``, data/sampling.py): a run resumed
  at another world size continues it. ``sample_indices(epoch)`` and ``shard_schedule(epoch)``:
  which samples this rank reads, and which shards, in order.
- ``split(name)``: a split memory-mapped (after its shards' sha256 were checked).
- ``build_model()``: the configured model, seeded the same on every rank, wrapped for DDP/FSDP.
- ``evaluate(model, split)``: the task's metrics on a whole split (collective).
- ``save_checkpoint(step, state)`` / ``restore_checkpoint()``: atomic, checksummed checkpoints
  in ``config.checkpoint.dir`` (rank 0 writes; all RNG states ride along and are restored), the
  newest valid one found again after a kill. ``state`` holds tensors, numbers, strings, lists
  and dicts (it is read back with ``torch.load(weights_only=True)``).
- ``report(step, **metrics)``: figures that reach Dagster through Pipes (rank 0) and the run's
  metrics history. A non-finite ``loss`` (or ``*_loss``) stops the run at once, not retried.
- ``guards`` (train/guarding.py): the hang watchdog, non-finite, loss-spike, stall, straggler and
  GPU-health checks, the same for every training. The watchdog counts each batch ``epochs``
  hands out and each ``report`` as progress, and waits while the context evaluates, reads or
  writes checkpoints and saves the model; ``with ctx.guards.paused():`` covers a long phase of
  your own that is no training step.
- ``should_stop()``: True on every rank once any rank got SIGTERM (preemption): save a
  checkpoint and return.
- ``save_model(model)``: the model as ``model.safetensors`` and ``model_card.json`` in
  ``config.output_dir``: what evaluation, registration, ONNX export and serving read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training_runtime.checkpoint import full as ckpt
from training_runtime.checkpoint.weights import StoredWeights
from training_runtime.config import ConfigError, RunConfig, check_partitions
from training_runtime.distributed.elastic import ELASTIC_ENV, resizes
from training_runtime.data.batches import split_loader
from training_runtime.data.prefetch import chained_epochs
from training_runtime.data.sampling import (
    ShardUse,
    epoch_indices,
    rank_epoch_indices,
    shard_schedule,
    steps_per_epoch,
)
from training_runtime.data.cache import ShardCache, default_cache_limit, shard_refs
from training_runtime.data.split import open_streaming_split
from training_runtime.distributed.fsdp import (
    describe_wrapping,
    full_model_state,
    full_optimizer_state,
    is_sharded,
    load_full_state,
    unwrap,
    wrap_model,
    wrapping_summary,
)
from training_runtime.distributed.process_group import (
    DistInfo,
    all_gather_object,
    broadcast_object,
    raise_if_any_failed,
)
from training_runtime.distributed.units import check_unit_names, parse_unit_names
from training_runtime.observe.attempts import AttemptLog, metrics_attempts, metrics_reported, read_attempts
from training_runtime.observe.telemetry import LogReporter, Reporter
from training_runtime.tasks.evaluation import evaluate_split
from training_runtime.train.epochs import EpochBatches, StopSignal
from training_runtime.train.faults import FaultInjection, delayed
from training_runtime.train.guarding import Guards
from training_runtime.train.loop_watch import LoopWatch
from training_runtime.train.model_files import save_model_files
from training_runtime.train.outputs import accelerator_versions, json_safe
from training_runtime.train.trial_channel import append_report, stop_reason

log = logging.getLogger(__name__)

# Settings that may differ between a checkpoint and the run resuming from it (checkpoints hold
# full, unsharded state, so DDP and FSDP runs resume from each other).
# The device, kernels' precision options, compilation and timeouts change how a step runs, not
# what the run is.
RESUMABLE_CHANGES = {"epochs", "max_steps", "num_workers", "prefetch_batches", "sharding", "device", "tf32",
                     "compile", "collective_timeout_s", "io_timeout_s",
                     # how the same model is sharded and recomputed: its parameter names and values are the same
                     "fsdp_units", "fsdp_unit_params", "activation_checkpointing"}


def training_fingerprint(config: dict[str, Any]) -> dict[str, Any]:
    """What must match for a checkpoint to continue this run. Settings a checkpoint's config
    predates count as their defaults, so checkpoints of an older runtime still resume."""
    train = {**_train_defaults(), **config["train"]}
    return {"model": config["model"], "commit_id": config["data"]["commit_id"],
            "manifest": config["data"]["manifest"], "task": config.get("task", "classification"),
            "train_fn": config.get("train_fn"),
            "train": {k: v for k, v in train.items() if k not in RESUMABLE_CHANGES}}


def _train_defaults() -> dict[str, Any]:
    from training_runtime.config import TrainConfig

    return dataclasses.asdict(TrainConfig())


class TrainingContext:
    def __init__(self, config: RunConfig, dist_info: DistInfo, reporter: Reporter | None = None,
                 restart_count: int = 0, fault: FaultInjection | None = None,
                 attempt_log: AttemptLog | None = None):
        """``fault``: the test hook (train/faults.py) or None; on attempt 0 it kills or stops rank
        ``fault.rank`` after the step it names is reported (user functions; the built-in loop
        checks after each optimizer step) or inside that checkpoint's write. ``attempt_log``:
        where this rank records its attempt (under torchrun; observe/attempts.py), or None."""
        self.config = config
        self.fault = fault
        self.dist = dist_info
        self.reporter = reporter or LogReporter()
        self.restart_count = restart_count
        self.attempt_log = attempt_log
        self.data_info = config.data_info()
        self.task = config.task_object()
        self.model_build = config.model_build()
        t = config.train
        config.validate_world_size(dist_info.world_size)
        if is_sharded(t.sharding):  # unit names the model lacks fail here, before any shard is read
            check_unit_names(self.model_build.build, parse_unit_names(t.fsdp_units))
        self.num_train_samples = config.data.manifest["splits"]["train"]["num_samples"]
        self.train_shard_sizes = [s["num_samples"] for s in config.data.manifest["splits"]["train"]["shards"]]
        self.local_batch_size = t.batch_size // dist_info.world_size
        self.steps_per_epoch = steps_per_epoch(self.num_train_samples, t.batch_size)
        # data.partitions 0 is the first launch's world size. It is resolved here, so checkpoints
        # and resolved_config.json record the number; a resumed run takes its checkpoint's.
        self._configured_partitions = config.data.partitions
        if config.data.partitions == 0:
            config.data.partitions = dist_info.world_size
        all_steps = t.epochs * self.steps_per_epoch
        self.total_steps = all_steps if t.max_steps is None else min(t.max_steps, all_steps)
        self._splits: dict[str, Any] = {}
        self._shard_cache: ShardCache | None = None
        self._stop = StopSignal()
        self.writer = ckpt.CheckpointWriter(
            config.checkpoint.dir, config.checkpoint.keep_last, config.checkpoint.async_save,
            before_publish=fault.checkpoint_hook(dist_info.rank, restart_count) if fault else None)
        # Reports go through self.reporter as it is then (the entry point wraps it for TensorBoard).
        self.guards = Guards(config, dist_info, _Forwarding(self), attempt_log, self.wait_for_checkpoints)
        self._loop_watch: LoopWatch | None = None
        if attempt_log is not None and self.is_main:
            attempt_log.start(dist_info.world_size)
        self.reported: list[dict[str, Any]] = []
        self.saved_model_card: dict | None = None
        self.wrapping: dict[str, Any] | None = None  # how build_model wrapped the model (distributed/fsdp.py)
        self.last_checkpoint_step: int | None = None
        self.resumed_from_step: int | None = None
        self.train_time_s = 0.0  # a user function's wall time (set by user_loop)
        # Image, build, nodes and GPUs of every rank (pod_lineage.py; set by the entry point).
        self.pod_record: dict[str, Any] | None = None

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """The guards watch what runs inside: every training function, the built-in trainer too."""
        self.guards.start()
        try:
            yield
        finally:
            self.guards.close()
            if self._loop_watch is not None:
                self._loop_watch.close()

    def watch_loop(self) -> None:
        """Measure a training function's steps around the batches and forwards the context sees
        (loop_watch.py), so the stall, straggler and GPU-health checks run for it. Collective."""
        if not self.config.guards.enabled:
            return
        self._loop_watch = LoopWatch(self.guards, self.dist, self.config.telemetry.every_steps)
        self.guards.locate(self._loop_watch.gpu_name())

    # ------------------------------------------------------------ who and where
    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def local_rank(self) -> int:
        return self.dist.local_rank

    @property
    def device(self) -> torch.device:
        return self.dist.device

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    # ------------------------------------------------------------ data
    def split(self, name: str):
        """The split ``name`` memory-mapped; one rank per node checks its shards first (collective
        on first use)."""
        if name not in self._splits:
            with self.guards.paused():
                self._open_split(name)
        return self._splits[name]

    def _open_split(self, name: str) -> None:
        """Nothing is downloaded or read here: each rank streams the shards it reads through its
        own cache (data/cache.py), each checked (sha256) when first read, so the first step waits
        for its first shards only."""
        cfg, err, split = self.config, None, None
        try:
            refs = shard_refs(cfg.data.manifest, cfg.data.locations, name)
            split = open_streaming_split(cfg.data.manifest, refs, name, self._cache_for(refs))
        except Exception as e:  # re-raised on every rank by raise_if_any_failed
            err = e
        raise_if_any_failed(err, f"{name} shards", self.dist.io_group)
        self._splits[name] = split

    def _cache_for(self, refs=()) -> ShardCache:
        """This rank's shard cache (``<data.cache_dir>/rank-<local rank>``, this rank's share of
        ``data.cache_limit``), made when a split first needs it. One per rank, not per node: the
        ranks of a node read different shards, so sharing would add locks, not hits."""
        if self._shard_cache is None:
            cfg = self.config
            if any(not r.is_local for r in refs):
                directory = f"{cfg.cache_dir()}/rank-{self.local_rank}"
                limit = cfg.data.cache_limit or default_cache_limit(cfg.cache_dir())
                share = limit // max(1, self.dist.local_world_size)
            else:
                directory, share = None, 1  # file:// shards only: read in place, nothing cached
            self._shard_cache = ShardCache(directory, share, cfg.data.read_ahead, cfg.data.s3_endpoint_url)
        elif self._shard_cache.dir is None and any(not r.is_local for r in refs):
            old, self._shard_cache = self._shard_cache, None  # a later split streams from S3
            self._shard_cache = self._cache_for(refs)
            self._shard_cache._verified_local |= old._verified_local
        return self._shard_cache

    def _all_data_figures(self) -> dict[str, Any]:
        """Every rank's streaming figures (collective): totals and per-rank lists for metrics.json."""
        per_rank = all_gather_object(self.data_figures()) if dist.is_initialized() else [self.data_figures()]
        out: dict[str, Any] = {}
        for key in per_rank[0]:
            values = [r[key] for r in per_rank]
            out[key] = max(values) if key == "cache_peak_bytes" else sum(values)
            out[f"per_rank_{key}"] = values
        return out

    def data_figures(self) -> dict[str, Any]:
        """This rank's streaming figures: bytes fetched, the cache's peak disk use, evictions."""
        c = self._shard_cache
        stats = c.stats.as_dict() if c is not None else {}
        return {"data_bytes_fetched": stats.get("bytes_fetched", 0), "cache_peak_bytes": stats.get("peak_bytes", 0),
                "cache_evictions": stats.get("evictions", 0), "cache_refetches": stats.get("refetches", 0),
                "cache_reused": stats.get("reused", 0)}

    def sample_indices(self, epoch: int) -> np.ndarray:
        """This rank's training sample indices of epoch ``epoch``, in the order its batches take them
        (``local_batch_size`` per global step; data/sampling.py)."""
        t, d = self.config.train, self.config.data
        if d.sample_order == "global":
            return epoch_indices(self.num_train_samples, self.world_size, self.rank, epoch, t.seed)
        return rank_epoch_indices(self.train_shard_sizes, t.seed, epoch, d.partitions, self.world_size, self.rank,
                                  t.batch_size, d.shuffle_block)

    def shard_schedule(self, epoch: int) -> list[ShardUse]:
        """The training shards this rank reads in epoch ``epoch``, in the order it first reads them,
        with the first and last of its batches that read each (``data.sampling.shard_schedule``)."""
        return shard_schedule(self.sample_indices(epoch), self.train_shard_sizes, self.local_batch_size)

    def epoch_loader(self, epoch: int, start_step: int = 0):
        """The raw loader of this rank's share of training epoch ``epoch`` from its step ``start_step``."""
        t = self.config.train
        idx = self.sample_indices(epoch)
        loader = split_loader(self.split("train"), self.data_info, idx, self.local_batch_size, start_step, self.device,
                              epoch=epoch, seed=t.seed, augment=t.augment, num_workers=t.num_workers,
                              prefetch_batches=t.prefetch_batches)
        if self.fault is not None and self.fault.slow_loader_s:  # test hook: a data stall
            loader.load_batches = delayed(loader.load_batches, self.fault.slow_loader_s)
        return loader

    def epochs(self, start_step: int = 0) -> Iterator[tuple[int, EpochBatches]]:
        """``(epoch, batches)`` from global step ``start_step`` to ``total_steps``; the caller stops
        after ``total_steps`` batches (the last epoch may hold more). Each batch handed out tells
        the guards the step before it has ended."""
        on_batch = self._handing_out if self._loop_watch is not None else None
        for epoch, loader in chained_epochs(self.epoch_loader, start_step, self.steps_per_epoch, self.total_steps):
            first = max(start_step, epoch * self.steps_per_epoch)
            yield epoch, EpochBatches(loader, self.data_info, first, on_batch)

    def _handing_out(self, step: int, wait_s: float) -> None:
        self._loop_watch.handing_out(step, wait_s)
        if self.fault:
            self.fault.slow_down(self.rank)  # test hook: this rank's own work on the batch takes longer

    # ------------------------------------------------------------ model
    def seed(self, offset: int) -> None:
        seed = self.config.train.seed * 1_000_003 + offset
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)

    def build_model(self) -> nn.Module:
        """The configured model, with the same initial weights on every rank, wrapped for the
        configured sharding; then per-rank RNG streams (dropout) are seeded."""
        self.seed(0)
        model = self.model_build.build()
        t = self.config.train
        self.wrapping = wrapping_summary(model, t.sharding, parse_unit_names(t.fsdp_units), t.fsdp_unit_params,
                                         t.activation_checkpointing)
        self.log(f"model {self.config.model.name}: {describe_wrapping(self.wrapping)}")
        wrapped = wrap_model(model, t.sharding, self.dist, precision=t.precision, units=parse_unit_names(t.fsdp_units),
                             unit_params=t.fsdp_unit_params, activation_checkpointing=t.activation_checkpointing)
        if t.compile:  # in place (nn.Module.compile): parameter names and state dicts are unchanged
            wrapped.compile()
        if self._loop_watch is not None:
            self._loop_watch.watch_model(wrapped)
        self.seed(1 + self.rank)
        return wrapped

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's state dict (collective under FSDP)."""
        return full_model_state(model, self.config.train.sharding)

    def full_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's whole state, keyed by parameter name (collective under FSDP)."""
        return full_optimizer_state(model, optimizer, self.config.train.sharding)

    def load_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, model_state: dict[str, Any],
                   optimizer_state: dict[str, Any] | None = None) -> None:
        """Load states saved with ``full_state`` / ``full_optimizer_state`` into the wrapped model
        (and optimizer), whatever the sharding."""
        if optimizer is not None:
            load_full_state(model, optimizer, model_state, optimizer_state, self.config.train.sharding)
        elif is_sharded(self.config.train.sharding):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
        else:
            unwrap(model).load_state_dict(model_state)

    def gather(self, obj: Any) -> list[Any]:
        """Collective: every rank's ``obj`` (e.g. an RNG state of its own), in rank order."""
        return all_gather_object(obj)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, model: nn.Module, split: str = "validation", batch_size: int | None = None) -> dict[str, Any]:
        """The task's metrics of ``model`` on the whole split (collective: call on every rank)."""
        with self.guards.paused():
            return evaluate_split(model, self.task, self.data_info, self.split(split), rank=self.rank,
                                  world_size=self.world_size, batch_size=batch_size or max(self.local_batch_size, 64),
                                  device=self.device, bf16=self.config.train.precision == "bf16")

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, state: dict[str, Any],
                        optimizer: torch.optim.Optimizer | None = None) -> None:
        """Collective. Rank 0 publishes ``state`` (plus the step, every rank's RNG states and the
        config) as checkpoint ``step``; the fsync and pruning finish in the background. With
        ``checkpoint.async_save``, naming the ``optimizer`` lets the copy of the parameters and
        optimizer state run beside the next forward and backward: that optimizer's next step
        waits for it (those tensors must change only in its step)."""
        with self.guards.paused():
            rngs = all_gather_object(ckpt.rng_state(self.device))
            if self.is_main:
                full = {**state, "step": step, "world_size": self.world_size, "rng": rngs,
                        "config": self.config.to_dict()}
                self.writer.save(step, full, optimizer)
            if not self.config.checkpoint.async_save:
                # The others wait for rank 0's write here, under the I/O timeout, rather than in the
                # next step's gradient all-reduce under the collective one.
                dist.barrier(group=self.dist.io_group)
        self.last_checkpoint_step = step

    def wait_for_checkpoints(self) -> None:
        if self.is_main:
            with self.guards.paused():
                self.writer.wait()

    def restore_checkpoint(self) -> dict[str, Any] | None:
        """Collective. The newest valid checkpoint's state with this rank's RNG restored, or None.
        Refuses a checkpoint of another run (model, data or training settings differ)."""
        with self.guards.paused():
            state = self._restore_checkpoint()
        if state is not None and self.is_main and self.attempt_log is not None:
            self.attempt_log.update(resumed_from_step=int(state["step"]))
        return state

    def _restore_checkpoint(self) -> dict[str, Any] | None:
        root = self.config.checkpoint.dir
        found = None
        if self.is_main:
            ckpt.remove_stale_temporaries(root)
            found = ckpt.find_latest_valid(root)
        # The other ranks wait here while rank 0 verifies every checkpoint's sha256: the I/O group.
        path = broadcast_object(None if found is None else str(found[0]), group=self.dist.io_group)
        if path is None:
            return None
        state = found[1] if self.is_main else ckpt.load_state(Path(path))
        if training_fingerprint(state["config"]) != training_fingerprint(self.config.to_dict()):
            raise ConfigError(
                f"checkpoint.dir {root} holds checkpoints of a different run ({path}: model, data or "
                "train settings differ); use a fresh checkpoint.dir or restore the original config")
        self._continue_sample_order(state["config"]["data"], path)
        if state["world_size"] == self.world_size:
            ckpt.set_rng_state(state["rng"][self.rank], self.device)
        elif self.config.data.sample_order == "partitioned":
            if self.is_main:
                self.reporter.info(f"the gang resized from {state['world_size']} to {self.world_size} ranks at step "
                                   f"{state['step']}: it resumes the same sample order from checkpoint {path}")
            log.warning("checkpoint %s was written by %d ranks, this run has %d: the same sample order "
                        "continues (data.partitions=%d), so every step averages the gradient of the same "
                        "samples; the weights equal an uninterrupted run's up to floating-point reduction "
                        "order, and each rank's RNG streams (dropout) are reseeded",
                        path, state["world_size"], self.world_size, self.config.data.partitions)
        else:
            log.warning("checkpoint %s was written by %d ranks, this run has %d: data.sample_order 'global' "
                        "depends on the world size, so the rest of this epoch repeats some samples and skips "
                        "others; RNG streams are reseeded", path, state["world_size"], self.world_size)
        self.last_checkpoint_step = self.resumed_from_step = int(state["step"])
        if self.is_main:
            self.reporter.info(f"resumed from checkpoint {path} at step {state['step']}")
        return state

    def _continue_sample_order(self, saved: dict[str, Any], path: str) -> None:
        """Take the checkpoint's sample order: its position means something in that order only.
        A checkpoint written before data.sample_order existed was written in the global order."""
        d = self.config.data
        order = saved.get("sample_order", "global")
        partitions, block = saved.get("partitions", 0), saved.get("shuffle_block", d.shuffle_block)
        asked = {"sample_order": d.sample_order, "shuffle_block": d.shuffle_block,
                 **({"partitions": self._configured_partitions} if self._configured_partitions else {})}
        kept = {"sample_order": order, "shuffle_block": block, "partitions": partitions}
        # a global-order checkpoint has no partitions or blocks to differ in
        differ = {k: v for k, v in asked.items() if v != kept[k] and (order == "partitioned" or k == "sample_order")}
        if differ:
            log.warning("checkpoint %s continues its own sample order: %s, not this config's %s",
                        path, ", ".join(f"data.{k}={kept[k]!r}" for k in differ),
                        ", ".join(f"{k}={v!r}" for k, v in differ.items()))
        d.sample_order = order
        if order == "partitioned":
            check_partitions(partitions, self.world_size, f"data.partitions of checkpoint {path}")
            d.partitions, d.shuffle_block = partitions, block

    # ------------------------------------------------------------ reporting
    def _gang_figures(self) -> dict[str, int]:
        """What every telemetry message of an elastic gang adds: the ranks of the group that trains
        now. Each message is a point of the live plots (and a TensorBoard scalar), so a resize shows
        there as a step in ``world_size`` at the step it resumed from. Empty for a fixed gang,
        whose size never changes."""
        return {"world_size": self.world_size} if os.environ.get(ELASTIC_ENV) else {}

    def report(self, step: int, **metrics: Any) -> None:
        """Record figures at ``step`` (every rank may call; rank 0's reach Dagster). Step ``step``
        has ended, for the hang watchdog; a non-finite loss stops the run (NonFiniteLoss)."""
        entry = {"step": int(step), **metrics}
        self.reported.append(entry)
        if self.is_main:
            if self.attempt_log is not None:  # kept per attempt: metrics.json lists every attempt's
                self.attempt_log.add_reported(entry)
            self.reporter.custom({"kind": "telemetry", **entry, **self._gang_figures()})
        self.guards.beat(int(step))
        self.guards.check_reported(int(step), metrics)
        if self.fault:
            self.fault.after_step(self.rank, int(step), self.restart_count)

    def log(self, message: str) -> None:
        if self.is_main:
            self.reporter.info(message)

    # ------------------------------------------------------------ stopping
    _stopped_together = False  # should_stop() said True: every rank stops with the one that got SIGTERM

    @property
    def stop_requested(self) -> bool:
        """This rank got SIGTERM, or ``should_stop()`` told it that another rank did (it tells every
        rank together): a function that stopped there ends as preempted on every rank."""
        return self._stop.requested or self._stopped_together

    def should_stop(self) -> bool:
        """Collective: True on every rank once any rank was asked to stop (SIGTERM). The flags are
        host-side, so they go through the gloo I/O group on the CPU: a device tensor read back
        here would drain the CUDA queue every time it is asked."""
        flag = torch.tensor([1 if self._stop.requested else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.dist.io_group)
        self._stopped_together = self._stopped_together or bool(flag.item())
        return bool(flag.item())

    # ------------------------------------------------------------ sweeps
    def report_validation(self, step: int, metrics: dict[str, Any]) -> None:
        """Rank 0 hands a validation's scalar metrics to the sweep watching this run, if any
        (validation.report_file); a custom training function calls it after its own validations."""
        path = self.config.validation.report_file
        if path and self.is_main:
            scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            append_report(path, {"step": int(step), **scalars})

    def prune_requested(self) -> str | None:
        """Collective: the reason the sweep asked this trial to stop (its pruner), on every rank, or
        None. Rank 0 reads the stop file and tells the others, so all ranks stop at the same step."""
        path = self.config.validation.stop_file
        if not path:
            return None
        return broadcast_object(stop_reason(path) if self.is_main else None, group=self.dist.io_group)

    # ------------------------------------------------------------ outputs
    def save_model(self, model: nn.Module | dict[str, torch.Tensor] | StoredWeights,
                   training: dict[str, Any] | None = None) -> None:
        """Collective. Rank 0 writes ``model.safetensors`` and ``model_card.json`` to output_dir.
        ``model``: the (wrapped) model (under FSDP its shards are gathered one tensor at a time,
        never all at once), or a full state dict already gathered."""
        with self.guards.paused():
            self._save_model(model, training)

    def _save_model(self, model: nn.Module | dict[str, torch.Tensor] | StoredWeights,
                    training: dict[str, Any] | None) -> None:
        # Streamed one tensor at a time (checkpoint/weights.py): an FSDP model's shards are gathered
        # a tensor at a time on every rank, never the whole model on rank 0; a state dict or a
        # stored file is written by rank 0 alone.
        from training_runtime.serve.card import build_card

        card = None
        if self.is_main:
            cfg, info = self.config, self.data_info
            card = build_card(factory=self.model_build.factory, kwargs=self.model_build.kwargs,
                              input_shape=self.model_build.input_shape, num_outputs=self.model_build.num_outputs,
                              extra_kwargs=self.model_build.extra_kwargs, task_card=self.task.card(), info=info,
                              manifest=cfg.data.manifest,
                              training={"data_commit": cfg.data.commit_id, "task": cfg.task,
                                        "train_fn": cfg.train_fn, **(training or {})})
        out = self.config.output_dir
        if isinstance(model, nn.Module) and is_sharded(self.config.train.sharding):
            self.saved_model_card = save_model_files(out, model.state_dict(), card, writer=self.is_main)
        elif self.is_main:
            weights = unwrap(model).state_dict() if isinstance(model, nn.Module) else model
            self.saved_model_card = save_model_files(out, weights, card, writer=True)
        else:
            self.saved_model_card = {}
        dist.barrier(group=self.dist.io_group)  # the others wait on rank 0's write: the I/O timeout

    def attempts(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(``attempts``, ``detections``) of metrics.json: this run's attempts, this one completed,
        and the detections of all of them. Under torchrun read from every attempt's records
        (torchrun restarts and Dagster retries alike); otherwise this attempt alone."""
        if self.attempt_log is None:
            this = {"restart_count": self.restart_count, "resumed_from_step": self.resumed_from_step,
                    "ended": "completed", "reason": None, "detections": list(self.guards.detections)}
            return [this], [{**d, "attempt": 1} for d in self.guards.detections]
        self.attempt_log.update(completed=True)
        return metrics_attempts(read_attempts(self.attempt_log.root))

    def write_outputs(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Rank 0: metrics.json (``metrics`` with every attempt and its detections) and
        resolved_config.json beside the model. Returns what metrics.json holds."""
        metrics = {**metrics, **self._all_data_figures()}  # collective: every rank writes outputs
        if not self.is_main:
            return {**metrics, "detections": list(self.guards.detections)}
        attempts, detections = self.attempts()
        metrics = {**metrics, "attempts": attempts, "detections": detections, "resizes": resizes(attempts)}
        if "reported" in metrics and self.attempt_log is not None:  # every attempt's, not this one's alone
            metrics["reported"] = metrics_reported(self.attempt_log.root, read_attempts(self.attempt_log.root),
                                                   self.attempt_log.attempt, metrics["reported"])
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        resolved = self.config.to_dict()
        resolved.update(world_size=self.world_size, backend=self.dist.backend, device=self.device.type,
                        steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps,
                        torch_version=torch.__version__, **accelerator_versions(self.device),
                        **({"wrapping": self.wrapping} if self.wrapping is not None else {}),
                        # an elastic gang's MIN:MAX nodes (its world_size above is the last group's)
                        **({"elastic": os.environ[ELASTIC_ENV]} if os.environ.get(ELASTIC_ENV) else {}),
                        **({"pod": self.pod_record} if self.pod_record is not None else {}))
        ckpt.atomic_write_json(out / "resolved_config.json", resolved)
        ckpt.atomic_write_json(out / "metrics.json", json_safe(metrics))
        return metrics


class _Forwarding:
    """The context's reporter as it is when a report is made (the entry point wraps it for
    TensorBoard after the context exists)."""

    def __init__(self, ctx: TrainingContext):
        self.ctx = ctx

    def info(self, message: str) -> None:
        self.ctx.reporter.info(message)

    def custom(self, payload: dict[str, Any]) -> None:
        self.ctx.reporter.custom(payload)
