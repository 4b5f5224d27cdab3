"""The training loop: data, model, optimizer, schedule, checkpoints, telemetry and outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import checkpoint as ckpt
from .config import ConfigError, RunConfig
from .data import PrefetchLoader, SplitData, chained_epochs, epoch_indices, resolve_shards, steps_per_epoch
from .distributed import (
    DistInfo, all_gather_object, broadcast_object, full_model_state, full_optimizer_state,
    load_full_state, raise_if_any_failed, wrap_model)
from .models import build_model
from .telemetry import LogReporter, Reporter, SystemStats, progress_line

log = logging.getLogger(__name__)

# Settings that may differ between a checkpoint and the run resuming from it (checkpoints hold
# full, unsharded state, so DDP and FSDP runs resume from each other).
_RESUMABLE_CHANGES = {"epochs", "max_steps", "num_workers", "prefetch_batches", "sharding"}


@dataclass(frozen=True)
class FaultInjection:
    """Test hook: rank ``rank`` SIGKILLs itself right after optimizer step ``step`` on the first
    attempt (TORCHELASTIC_RESTART_COUNT 0), so a restarted attempt runs through. With
    ``in_checkpoint_write`` the kill comes inside the write of checkpoint ``step`` instead: the
    state file is on disk, the checkpoint is not yet published."""

    rank: int
    step: int
    in_checkpoint_write: bool = False

    def kill_mid_step(self, rank: int, step: int, restart_count: int) -> bool:
        return not self.in_checkpoint_write and restart_count == 0 and rank == self.rank and step == self.step

    def kill_in_checkpoint_write(self, rank: int, step: int, restart_count: int) -> bool:
        return self.in_checkpoint_write and restart_count == 0 and rank == self.rank and step == self.step


def make_optimizer(cfg: RunConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=t.lr, momentum=0.9, weight_decay=t.weight_decay)


def lr_multiplier(schedule: str, warmup_steps: int, total_steps: int, step: int) -> float:
    """LR factor for optimizer step ``step`` (0-based)."""
    if warmup_steps and step < warmup_steps and schedule != "cosine":  # cosine: no warmup
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    start = warmup_steps if schedule == "linear_warmup_cosine" else 0
    span = max(1, total_steps - start)
    progress = min(1.0, (step - start) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def training_fingerprint(config: dict[str, Any]) -> dict[str, Any]:
    return {"model": config["model"], "commit_id": config["data"]["commit_id"],
            "manifest": config["data"]["manifest"],
            "train": {k: v for k, v in config["train"].items() if k not in _RESUMABLE_CHANGES}}


@dataclass
class RunTotals:
    """Throughput figures of the whole run, carried in checkpoints so restarts keep them."""

    samples: int
    train_time_s: float  # time in training steps (mean over ranks), checkpoint stalls excluded
    steps_timed: int
    step_time_s: list[float]  # per rank
    wait_s: list[float]  # per rank: time waiting for the next batch
    checkpoint_stall_s: float

    @classmethod
    def empty(cls, world_size: int) -> RunTotals:
        return cls(0, 0.0, 0, [0.0] * world_size, [0.0] * world_size, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], world_size: int) -> RunTotals:
        t = cls(**d)
        if len(t.step_time_s) != world_size:  # per-rank figures restart with a new world size
            t.steps_timed, t.step_time_s, t.wait_s = 0, [0.0] * world_size, [0.0] * world_size
        return t


class _Interval:
    """This rank's figures since the last boundary."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)  # summed on device: no sync per step
        self.steps, self.samples, self.time_s, self.wait_s = 0, 0, 0.0, 0.0

    def add(self, time_s: float, wait_s: float, samples: int) -> None:
        self.steps += 1
        self.samples += samples
        self.time_s += time_s
        self.wait_s += wait_s


class Trainer:
    def __init__(self, cfg: RunConfig, info: DistInfo, reporter: Reporter | None = None,
                 fault: FaultInjection | None = None, restart_count: int = 0):
        """``restart_count``: torchrun's TORCHELASTIC_RESTART_COUNT (reported, and the fault hook
        fires only on attempt 0)."""
        self.cfg, self.info, self.fault = cfg, info, fault
        self.reporter = reporter or LogReporter()
        t = cfg.train
        cfg.validate_world_size(info.world_size)
        man = cfg.data.manifest
        self.num_samples = man["splits"]["train"]["num_samples"]
        self.local_batch = t.batch_size // info.world_size
        self.steps_per_epoch = steps_per_epoch(self.num_samples, info.world_size, t.batch_size)
        all_steps = t.epochs * self.steps_per_epoch
        self.total_steps = all_steps if t.max_steps is None else min(t.max_steps, all_steps)
        self.restart_count = restart_count

    # ------------------------------------------------------------ setup
    def _prepare_data(self) -> SplitData:
        cfg, err = self.cfg, None
        if self.info.local_rank == 0:  # one rank per node downloads and verifies
            try:
                resolve_shards(cfg.data.manifest, cfg.data.locations, "train", cfg.cache_dir(),
                               cfg.data.s3_endpoint_url, verify=True)
            except Exception as e:
                err = e
        raise_if_any_failed(err, "shard verification")
        paths = resolve_shards(cfg.data.manifest, cfg.data.locations, "train", cfg.cache_dir(),
                               cfg.data.s3_endpoint_url, verify=False)
        return SplitData(cfg.data.manifest, paths, "train")

    def _seed(self, offset: int) -> None:
        seed = self.cfg.train.seed * 1_000_003 + offset
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)

    def _build(self) -> None:
        cfg, info = self.cfg, self.info
        man = cfg.data.manifest
        self._seed(0)  # identical initial weights on every rank
        model = build_model(cfg.model.name, man["feature_shape"], man["num_classes"], **cfg.model.kwargs)
        self.model = wrap_model(model, cfg.train.sharding, info)
        self._seed(1 + info.rank)  # per-rank dropout streams
        self.optimizer = make_optimizer(cfg, self.model)
        t = cfg.train
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(t.lr_schedule, t.warmup_steps, self.total_steps, s))

    # ------------------------------------------------------------ checkpoints
    def _checkpoint_fault(self):
        """The fault hook's callback for ``write_checkpoint`` (None without an in-write fault)."""
        f, rank, restarts = self.fault, self.info.rank, self.restart_count
        if not (f and f.in_checkpoint_write):
            return None

        def kill_if_due(step: int) -> None:
            if f.kill_in_checkpoint_write(rank, step, restarts):
                os.kill(os.getpid(), signal.SIGKILL)
        return kill_if_due

    def _save(self, step: int) -> float:
        """Collective. Returns the time training stood still for this save."""
        t0 = time.perf_counter()
        sharding = self.cfg.train.sharding
        model_sd = full_model_state(self.model, sharding)
        optim_sd = full_optimizer_state(self.model, self.optimizer, sharding)
        rngs = all_gather_object(ckpt.rng_state(self.info.device))
        if self.info.is_main:
            state = {
                "step": step, "epoch": step // self.steps_per_epoch,
                "step_in_epoch": step % self.steps_per_epoch, "world_size": self.info.world_size,
                "model": model_sd, "optimizer": optim_sd, "scheduler": self.scheduler.state_dict(),
                "rng": rngs, "config": self.cfg.to_dict(), "history": self._history_state(),
            }
            self.writer.save(step, state)  # async mode stages a host copy itself
        self.last_saved_step = step
        return time.perf_counter() - t0

    def _history_state(self) -> dict[str, Any]:
        return {"loss_history": [list(x) for x in self.loss_history],
                "lr_history": [list(x) for x in self.lr_history], "totals": self.totals.to_dict()}

    def _resume(self) -> int | None:
        """Load the newest valid checkpoint into model/optimizer/scheduler/RNG; returns its step."""
        root = self.cfg.checkpoint.dir
        found = None
        if self.info.is_main:
            ckpt.remove_stale_temporaries(root)
            found = ckpt.find_latest_valid(root)
        path = broadcast_object(None if found is None else str(found[0]))
        if path is None:
            return None
        state = found[1] if self.info.is_main else ckpt.load_state(Path(path))
        if training_fingerprint(state["config"]) != training_fingerprint(self.cfg.to_dict()):
            raise ConfigError(
                f"checkpoint.dir {root} holds checkpoints of a different run ({path}: model, data or "
                "train settings differ); use a fresh checkpoint.dir or restore the original config")
        if state["step"] > self.total_steps:
            raise ConfigError(
                f"checkpoint {path} is at step {state['step']}, past this run's {self.total_steps} "
                "steps; raise train.epochs / train.max_steps or use a fresh checkpoint.dir")
        load_full_state(self.model, self.optimizer, state["model"], state["optimizer"],
                        self.cfg.train.sharding)
        self.scheduler.load_state_dict(state["scheduler"])
        if state["world_size"] == self.info.world_size:
            ckpt.set_rng_state(state["rng"][self.info.rank], self.info.device)
        else:
            log.warning("checkpoint %s was written by %d ranks, this run has %d: RNG streams are "
                        "reseeded, so the run is not bit-identical to an uninterrupted one",
                        path, state["world_size"], self.info.world_size)
        self.loss_history = [tuple(x) for x in state["history"]["loss_history"]]
        self.lr_history = [tuple(x) for x in state["history"]["lr_history"]]
        self.totals = RunTotals.from_dict(state["history"]["totals"], self.info.world_size)
        if self.info.is_main:
            self.reporter.info(f"resumed from checkpoint {path} at step {state['step']}")
        return int(state["step"])

    # ------------------------------------------------------------ training
    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        accum = self.cfg.train.grad_accum_steps
        chunks = [(cx, cy) for cx, cy in zip(x.tensor_split(accum), y.tensor_split(accum)) if len(cx)]
        n = len(x)
        total = torch.zeros((), device=self.info.device)
        bf16 = self.cfg.train.precision == "bf16"
        for i, (cx, cy) in enumerate(chunks):
            last = i == len(chunks) - 1
            with self._grad_sync(last), torch.autocast(self.info.device.type, dtype=torch.bfloat16,
                                                       enabled=bf16):
                loss = F.cross_entropy(self.model(cx), cy) * (len(cx) / n)
            loss.backward()
            total += loss.detach().float()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def _grad_sync(self, enabled: bool):
        if self.cfg.train.sharding == "fsdp":
            self.model.set_requires_gradient_sync(enabled)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if enabled else self.model.no_sync()

    def run(self) -> dict[str, Any]:
        cfg, info = self.cfg, self.info
        data = self._prepare_data()
        self._build()
        self.loss_history: list[tuple[int, float]] = []
        self.lr_history: list[tuple[int, float]] = []
        self.totals = RunTotals.empty(info.world_size)
        self.writer = ckpt.CheckpointWriter(cfg.checkpoint.dir, cfg.checkpoint.keep_last,
                                            cfg.checkpoint.async_save, before_publish=self._checkpoint_fault())
        resumed = self._resume()
        step = resumed or 0
        self.last_saved_step = resumed
        self.stats = SystemStats(info.device) if info.is_main else None
        if info.is_main:
            self.reporter.info(
                f"training {cfg.model.name} on {self.num_samples} samples, {info.world_size} rank(s) "
                f"{info.backend}/{info.device.type}, {self.steps_per_epoch} steps/epoch, "
                f"{self.total_steps} steps, starting at step {step}")
        self.model.train()
        self.t_start = time.perf_counter()
        self.start_step = step
        attempt_steps = 0
        iv = _Interval(info.device)

        def make_loader(epoch: int, in_epoch: int) -> PrefetchLoader:
            idx = epoch_indices(self.num_samples, info.world_size, info.rank, epoch, cfg.train.seed)
            return PrefetchLoader(data, idx, self.local_batch, in_epoch, info.device,
                                  cfg.train.num_workers, cfg.train.prefetch_batches)

        for epoch, loader in chained_epochs(make_loader, step, self.steps_per_epoch, self.total_steps):
            seen_wait = 0.0
            t_prev = time.perf_counter()
            for batch in loader:
                lr = self.scheduler.get_last_lr()[0]
                iv.loss += self._train_step(batch.x, batch.y)
                step += 1
                attempt_steps += 1
                now = time.perf_counter()
                iv.add(now - t_prev, loader.wait_s - seen_wait, len(batch.x) * info.world_size)
                t_prev, seen_wait = now, loader.wait_s
                if self.fault and self.fault.kill_mid_step(info.rank, step, self.restart_count):
                    os.kill(os.getpid(), signal.SIGKILL)
                if self._is_boundary(step):
                    self._close_interval(iv, step, epoch, lr)
                    iv = _Interval(info.device)
                if step % cfg.checkpoint.every_steps == 0 or step == self.total_steps:
                    self.totals.checkpoint_stall_s += self._save(step)
                    t_prev = time.perf_counter()  # the stall is reported apart from step time
                if step >= self.total_steps:
                    break
            if step >= self.total_steps:
                break
        if self.last_saved_step != step:
            self.totals.checkpoint_stall_s += self._save(step)
        if info.is_main:
            self.writer.wait()
        final_sd = full_model_state(self.model, cfg.train.sharding)
        metrics = self._metrics(step, attempt_steps, resumed)
        if info.is_main:
            self._write_outputs(final_sd, metrics)
            self.stats.close()
            final = {k: v for k, v in metrics.items() if not k.endswith("_history")}
            self.reporter.custom({"kind": "final", **final})
        dist.barrier()
        return metrics

    def _is_boundary(self, step: int) -> bool:
        """Steps where ranks exchange loss and timings: telemetry, progress (~10%), checkpoints
        (so checkpointed totals are exact) and the last step."""
        progress_every = max(1, math.ceil(self.total_steps / 10))
        return (step % self.cfg.telemetry.every_steps == 0 or step % progress_every == 0
                or step % self.cfg.checkpoint.every_steps == 0 or step == self.total_steps)

    def _close_interval(self, iv: _Interval, step: int, epoch: int, lr: float) -> None:
        """Collective: average the loss, gather per-rank timings, record history, report."""
        info, cfg, totals = self.info, self.cfg, self.totals
        # One all_gather of [loss sum, steps, time, wait] per rank: a collective's latency, not
        # the three (all_reduce, then all_gather_object's size and payload exchanges) it was.
        mine = torch.cat([iv.loss.detach().double().reshape(1),
                          torch.tensor([iv.steps, iv.time_s, iv.wait_s], dtype=torch.float64, device=info.device)])
        gathered = [torch.empty_like(mine) for _ in range(info.world_size)]
        dist.all_gather(gathered, mine)
        per_rank = torch.stack(gathered).cpu().tolist()
        loss = sum(r[0] for r in per_rank) / sum(r[1] for r in per_rank)
        ranks = [(r[2], r[3]) for r in per_rank]
        times = [t for t, _ in ranks]
        mean_time = sum(times) / len(times)
        totals.samples += iv.samples
        totals.steps_timed += iv.steps
        totals.train_time_s += mean_time
        for r, (t, w) in enumerate(ranks):
            totals.step_time_s[r] += t
            totals.wait_s[r] += w
        self.loss_history.append((step, loss))
        self.lr_history.append((step, lr))
        if not info.is_main:
            return
        sps = iv.samples / max(1e-12, mean_time)
        if step % max(1, math.ceil(self.total_steps / 10)) == 0 or step == self.total_steps:
            self.reporter.info(progress_line(
                epoch=epoch + 1, epochs=cfg.train.epochs, step=step, total=self.total_steps,
                start_step=self.start_step, loss=loss, samples_per_second=sps,
                elapsed_s=time.perf_counter() - self.t_start))
        if step % cfg.telemetry.every_steps == 0 or step == self.total_steps:
            self.reporter.custom({
                "kind": "telemetry", "step": step, "epoch": epoch + 1, "loss": loss, "lr": lr,
                "samples_per_second": sps,
                "data_wait_share": sum(w for _, w in ranks) / max(1e-12, sum(times)),
                "per_rank_step_time_s": [t / iv.steps for t in times],
                "per_rank_data_wait_share": [w / max(1e-12, t) for t, w in ranks],
                **self.stats.sample()})

    def _metrics(self, step: int, attempt_steps: int, resumed: int | None) -> dict[str, Any]:
        info, cfg, t = self.info, self.cfg, self.totals
        if not self.loss_history:
            raise RuntimeError(f"no loss was recorded; checkpoint.dir {cfg.checkpoint.dir} holds a "
                               "finished run without history; use a fresh checkpoint.dir")
        return {
            "final_loss": self.loss_history[-1][1],
            "samples_per_second": t.samples / max(1e-12, t.train_time_s),
            "data_wait_share": sum(t.wait_s) / max(1e-12, sum(t.step_time_s)),
            "data_wait_s_total": sum(t.wait_s),
            "steps": step, "total_steps": self.total_steps, "steps_this_attempt": attempt_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": round(step / self.steps_per_epoch, 4),
            "samples_seen": t.samples, "train_time_s": t.train_time_s,
            "world_size": info.world_size, "backend": info.backend, "device": info.device.type,
            "sharding": cfg.train.sharding,
            "loss_history": [list(x) for x in self.loss_history],
            "lr_history": [list(x) for x in self.lr_history],
            "per_rank_step_time_s": [s / max(1, t.steps_timed) for s in t.step_time_s],
            "per_rank_data_wait_share": [w / max(1e-12, s) for s, w in zip(t.step_time_s, t.wait_s)],
            "checkpoint_stall_s_total": t.checkpoint_stall_s,
            "resumed_from_step": resumed,
            "restart_count": self.restart_count,
            "commit_id": cfg.data.commit_id,
        }

    def _write_outputs(self, model_sd: dict[str, torch.Tensor], metrics: dict[str, Any]) -> None:
        out = Path(self.cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        ckpt.atomic_torch_save(out / "weights.pt", {k: v.detach().cpu() for k, v in model_sd.items()})
        resolved = self.cfg.to_dict()
        resolved.update(world_size=self.info.world_size, backend=self.info.backend,
                        device=self.info.device.type, steps_per_epoch=self.steps_per_epoch,
                        total_steps=self.total_steps, torch_version=torch.__version__)
        ckpt.atomic_write_json(out / "resolved_config.json", resolved)
        ckpt.atomic_write_json(out / "metrics.json", metrics)
        self.reporter.info(f"wrote weights.pt, resolved_config.json, metrics.json to {out}: "
                           f"final loss {metrics['final_loss']:.4f}, {metrics['steps']} steps")
