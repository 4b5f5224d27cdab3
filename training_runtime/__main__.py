"""Entry point: ``torchrun --nproc-per-node=N -m training_runtime --config /abs/config.json``.

Every failure of a rank is recorded beside the checkpoints with whether a new attempt can fix it
(train/failures.py); one that would repeat stops torchrun's agent, so it is neither restarted nor,
by the orchestrator, retried. A restarted attempt after such a failure refuses to start. Fault
hooks for tests: train/faults.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from training_runtime.config import ConfigError, RunConfig
from training_runtime.distributed.process_group import broadcast_object, close_distributed, init_distributed
from training_runtime.observe.build_info import verify_image
from training_runtime.observe.error_file import AtomicErrorHandler
from training_runtime.observe.pod_lineage import gather_pod_record
from training_runtime.observe.telemetry import LogReporter
from training_runtime.observe.tensorboard import tensorboard_reporting
from training_runtime.train.context import TrainingContext
from training_runtime.train.failures import FailureRecorder
from training_runtime.train.faults import fault_from_env
from training_runtime.train.numerics import configure_numerics
from training_runtime.train.trainer import Trainer
from training_runtime.train.user_loop import run_train_fn


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read --config {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def _load_config(raw: dict[str, Any]) -> RunConfig:
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
        # reads a config that code may not understand.
        build = verify_image()
        raw = _read_config(args.config)
        failures = FailureRecorder.for_config(raw, os.environ, rank, reporter=reporter)
        try:
            failures.refuse_restart()
            return _run(raw, failures, reporter, build)
        except Exception as exc:
            failures.record(exc)
            raise


def _run(raw: dict[str, Any], failures: FailureRecorder, reporter: Any, build: Any) -> int:
    cfg = _load_config(raw)  # validated before any process group or data access
    fault = fault_from_env()
    configure_numerics(cfg.train)  # before the first CUDA kernel
    t = cfg.train
    info = init_distributed(t.device, t.collective_timeout_s, t.io_timeout_s)
    try:
        failures.agree_attempt(info.rank, lambda obj: broadcast_object(obj, group=info.io_group))
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        context = TrainingContext(cfg, info, reporter, restarts, fault, attempt_log=failures.log)
        context.pod_record = gather_pod_record(info, build)
        # Rank 0 also writes TensorBoard event files beside the checkpoints (telemetry.tensorboard).
        with tensorboard_reporting(
                context.reporter, enabled=context.is_main and context.config.telemetry.tensorboard,
                checkpoint_dir=context.config.checkpoint.dir,
                resumed_from_step=lambda: context.resumed_from_step) as context.reporter:
            if cfg.train_fn is not None:
                run_train_fn(context)
            else:
                Trainer(cfg, info, context=context).run()
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


def exit_without_finalizing(code: int) -> None:
    """Ends a rank that finished: its exit handlers run (logging's flush among them) and its
    output is flushed, then the process ends without the interpreter's finalization. The process
    group is destroyed by then, but objects that held it (DDP's reducer, a subgroup) are freed only
    at finalization, where a C++ thread of theirs can be destroyed unjoined: std::terminate, and a
    rank that trained to the end exits on SIGABRT, so torchrun fails the attempt (seen once in a
    2-rank gloo training inside the training image: "terminate called without an active
    exception", no Python frame; pytorch/pytorch#179291 describes the same teardown). A failing
    rank exits normally: its traceback and error file matter more than this."""
    import atexit

    atexit._run_exitfuncs()  # what finalization would run first, while the interpreter is whole
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalizing(record(main, error_handler=AtomicErrorHandler())() or 0)
