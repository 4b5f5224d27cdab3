"""Running a user's training function (``train_fn = "pkg.module:main"``) on every rank with the
``TrainingContext``, under the same guards as the built-in trainer, and holding it to what the
platform promises downstream: figures reported, a model saved, and checkpoints to resume from
after a kill."""

from __future__ import annotations

import importlib
import inspect
import time
from typing import Any, Callable

from training_runtime.checkpoint import full as ckpt
from training_runtime.config import ConfigError
from training_runtime.train.context import TrainingContext
from training_runtime.train.failures import TrainFnError, TrainingPreempted


def resolve_train_fn(path: str) -> Callable[[TrainingContext], Any]:
    module, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"train_fn {path!r} cannot be imported ({e}); check the import path") from e
    try:
        inspect.signature(fn).bind(object())
    except TypeError as e:
        raise ConfigError(f"train_fn {path!r} must take one argument, the TrainingContext: {e}") from e
    except ValueError:
        pass  # no introspectable signature: the call reports
    return fn


def run_train_fn(ctx: TrainingContext) -> dict[str, Any]:
    """Call the configured function under the context's guards; raise TrainFnError naming what it
    failed to do (a new attempt would fail the same way, so it is not retried)."""
    path = ctx.config.train_fn
    fn = resolve_train_fn(path)
    if ctx.restart_count > 0 and not ckpt.list_checkpoints(ctx.config.checkpoint.dir):
        raise TrainFnError(
            f"train_fn {path!r}: attempt {ctx.restart_count + 1} follows an attempt that died, and that attempt "
            f"saved no checkpoint in {ctx.config.checkpoint.dir}; call ctx.save_checkpoint(step, state) regularly "
            "(and ctx.restore_checkpoint() at the start) so that a restart resumes instead of starting over")
    with ctx.guarded():
        ctx.watch_loop()
        started = time.perf_counter()
        fn(ctx)
        ctx.train_time_s = time.perf_counter() - started
    # Every rank that stopped for it, not only the one that got SIGTERM: its peers return from a
    # function that stopped at should_stop() without a model, which is no bug of the function.
    if ctx.stop_requested:
        ctx.wait_for_checkpoints()
        raise TrainingPreempted(f"train_fn {path!r} stopped on SIGTERM (checkpoint at step {ctx.last_checkpoint_step} "
                                f"in {ctx.config.checkpoint.dir}); a restart resumes from it")
    # A group restarted after the last step (a node joined as the training ended) resumes at the end
    # and has no step left to report: the earlier attempts' reports stand (metrics_reported).
    ended_before = ctx.resumed_from_step is not None and ctx.resumed_from_step >= ctx.total_steps
    if not ctx.reported and not ended_before:
        raise TrainFnError(f"train_fn {path!r} returned without reporting any figure; call ctx.report(step, "
                           "loss=...) as it trains (the run's metrics and Dagster's charts come from it)")
    if ctx.saved_model_card is None:
        raise TrainFnError(f"train_fn {path!r} returned without saving a model; call ctx.save_model(model) at the "
                           "end (evaluation and registration read model.safetensors and model_card.json)")
    ctx.wait_for_checkpoints()
    metrics = ctx.write_outputs(user_metrics(ctx))
    if ctx.is_main:
        ctx.reporter.custom({"kind": "final", **{k: v for k, v in metrics.items() if not k.endswith("_history")
                                                 and k not in ("reported", "attempts")}})
    return metrics


def user_metrics(ctx: TrainingContext) -> dict[str, Any]:
    """metrics.json of a user function's run: what it reported, in the built-in trainer's keys
    where they mean the same."""
    reported = [{k: _plain(v) for k, v in r.items()} for r in ctx.reported]
    losses = [[r["step"], float(r["loss"])] for r in reported
              if isinstance(r.get("loss"), (int, float)) and not isinstance(r.get("loss"), bool)]
    # A group restarted after the last step (a node joined as the training ended) resumes there and
    # reports nothing: its steps are the checkpoint's.
    steps = max((r["step"] for r in reported), default=ctx.resumed_from_step or 0)
    trained = steps - (ctx.resumed_from_step or 0)  # this attempt's steps, in the time it took
    return {
        "final_loss": losses[-1][1] if losses else None,
        "steps": steps,
        # The function's wall time (evaluation and saving included), so a lower bound on its speed.
        "train_time_s": ctx.train_time_s,
        "samples_per_second": trained * ctx.config.train.batch_size / max(1e-9, ctx.train_time_s),
        "loss_history": losses,
        "reported": reported,
        "task": ctx.task.name, "train_fn": ctx.config.train_fn,
        "world_size": ctx.world_size, "backend": ctx.dist.backend, "device": ctx.device.type,
        "restart_count": ctx.restart_count, "commit_id": ctx.config.data.commit_id,
        "resumed_from_step": ctx.resumed_from_step,
    }


def _plain(v: Any) -> Any:
    """Reported values as JSON: tensors and numpy scalars become numbers."""
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (ValueError, RuntimeError):
            return v.tolist()
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)
