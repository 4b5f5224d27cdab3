"""Entry point: ``torchrun --nproc-per-node=N -m training_runtime --config /abs/config.json``.

Test hook: ``TRAINING_RUNTIME_FAULT_KILL_AT_STEP=RANK:STEP`` makes rank RANK SIGKILL itself after
optimizer step STEP on the first attempt (to exercise ``torchrun --max-restarts``);
``RANK:STEP:checkpoint`` kills it inside the write of checkpoint STEP instead, after the state file
is on disk and before the checkpoint is published (rank 0 writes checkpoints).
``TRAINING_RUNTIME_FAULT_SLOW_RANK=RANK:SECONDS`` makes a rank sleep before each forward (a
straggler), ``TRAINING_RUNTIME_FAULT_SLOW_LOADER=SECONDS`` every batch load (a data stall) and
``TRAINING_RUNTIME_FAULT_STOP_AT_STEP=RANK:STEP`` a rank SIGSTOP itself on the first attempt (a hang).
They are read only here and handed to the trainer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from training_runtime.config import ConfigError, RunConfig
from training_runtime.distributed.process_group import close_distributed, init_distributed
from training_runtime.observe.build_info import verify_image
from training_runtime.observe.error_file import AtomicErrorHandler
from training_runtime.observe.pod_lineage import gather_pod_record
from training_runtime.observe.telemetry import LogReporter
from training_runtime.observe.tensorboard import tensorboard_reporting
from training_runtime.train.context import TrainingContext
from training_runtime.train.numerics import configure_numerics
from training_runtime.train.trainer import FaultInjection, Trainer
from training_runtime.train.user_loop import run_train_fn

FAULT_ENV = "TRAINING_RUNTIME_FAULT_KILL_AT_STEP"
SLOW_RANK_ENV = "TRAINING_RUNTIME_FAULT_SLOW_RANK"  # RANK:SECONDS slept before each forward (a straggler)
SLOW_LOADER_ENV = "TRAINING_RUNTIME_FAULT_SLOW_LOADER"  # SECONDS slept in each batch load (a data stall)
STOP_ENV = "TRAINING_RUNTIME_FAULT_STOP_AT_STEP"  # RANK:STEP: the rank SIGSTOPs itself on attempt 0 (a hang)


def _fault_from_env() -> FaultInjection | None:
    kill, slow_rank, slow_loader, stop = (os.environ.get(k) for k in (FAULT_ENV, SLOW_RANK_ENV, SLOW_LOADER_ENV,
                                                                       STOP_ENV))
    if not (kill or slow_rank or slow_loader or stop):
        return None
    fields: dict = {}
    if kill:
        rank, _, rest = kill.partition(":")
        step, _, where = rest.partition(":")
        if not (rank.isdigit() and step.isdigit()) or where not in ("", "checkpoint"):
            raise ConfigError(f"{FAULT_ENV} must be 'RANK:STEP' or 'RANK:STEP:checkpoint', got {kill!r}")
        fields.update(rank=int(rank), step=int(step), in_checkpoint_write=where == "checkpoint")
    try:
        if slow_rank:
            rank, _, seconds = slow_rank.partition(":")
            fields.update(slow_rank=int(rank), slow_rank_s=float(seconds))
        if slow_loader:
            fields.update(slow_loader_s=float(slow_loader))
        if stop:
            rank, _, step = stop.partition(":")
            fields.update(stop_rank=int(rank), stop_step=int(step))
    except ValueError as e:
        raise ConfigError(f"{SLOW_RANK_ENV} must be 'RANK:SECONDS', {SLOW_LOADER_ENV} 'SECONDS' and {STOP_ENV} "
                          f"'RANK:STEP': {e}") from e
    return FaultInjection(**fields)


def _load_config(path: str) -> RunConfig:
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read --config {path}: {e}") from e
    cfg = RunConfig.from_dict(raw)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg.validate_world_size(world)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training_runtime", description=__doc__)
    parser.add_argument("--config", required=True, help="absolute path of the run's config.json")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s")
    if rank == 0 and os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from training_runtime.observe.pipes import PipesReporter

        reporting = PipesReporter()
    else:
        reporting = contextlib.nullcontext(LogReporter())
    with reporting as reporter:
        # First: in a pod, an image built from other code than the run's fails here, before it
        # parses a config that code may not understand.
        build = verify_image()
        cfg = _load_config(args.config)  # validated before any process group or data access
        fault = _fault_from_env()
        configure_numerics(cfg.train)  # before the first CUDA kernel
        t = cfg.train
        info = init_distributed(t.device, t.collective_timeout_s, t.io_timeout_s)
        try:
            restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
            context = TrainingContext(cfg, info, reporter, restarts, fault)
            context.pod_record = gather_pod_record(info, build)
            # Rank 0 also writes TensorBoard event files beside the checkpoints (telemetry.tensorboard).
            with tensorboard_reporting(
                    context.reporter, enabled=context.is_main and context.config.telemetry.tensorboard,
                    checkpoint_dir=context.config.checkpoint.dir,
                    resumed_from_step=lambda: context.resumed_from_step) as context.reporter:
                if cfg.train_fn is not None:
                    run_train_fn(context)
                else:
                    Trainer(cfg, info, context.reporter, fault, restart_count=restarts, context=context).run()
        finally:
            close_distributed()
        if cfg.evaluation.enabled and info.is_main:
            # After the process group is closed: the other ranks have finished, and no collective
            # timeout bounds one rank's pass over the whole test split.
            from training_runtime.serve.evaluate_after_training import EVALUATION_FILE, evaluate_after_training

            evaluation = evaluate_after_training(cfg, info.device)
            reporter.info(f"evaluated the written model on {evaluation['device']}: wrote {EVALUATION_FILE} "
                          f"(test and validation splits, {evaluation['test']['num_samples']} test samples)")
    return 0


if __name__ == "__main__":
    sys.exit(record(main, error_handler=AtomicErrorHandler())())
