"""A training function that records which samples each rank trains on, step by step
(``train_fn = "tests.runtime.sample_order_train:main"``): column 0 of every feature row is the
sample's index / ID_SCALE (tests/runtime/test_sample_order_resume.py writes the shards so)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from training_runtime.train.context import TrainingContext

ID_SCALE = 1000.0


def sample_ids(features: torch.Tensor) -> list[int]:
    return np.rint(features[:, 0].double().numpy() * ID_SCALE).astype(int).tolist()


def main(ctx: TrainingContext) -> None:
    """Resume, train, record each step's sample ids, checkpoint every checkpoint.every_steps, and
    stop after a checkpoint when ``ctx.should_stop()`` says so."""
    seen = Path(ctx.config.checkpoint.dir).parent / "seen"
    seen.mkdir(parents=True, exist_ok=True)
    log = seen / f"w{ctx.world_size}-r{ctx.rank}-pid{os.getpid()}.jsonl"
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=ctx.config.train.lr)
    step = 0
    state = ctx.restore_checkpoint()
    if state is not None:
        ctx.load_state(model, opt, state["model"], state["optimizer"])
        step = state["step"]
    with log.open("a") as out:
        for epoch, batches in ctx.epochs(step):
            for batch in batches:
                out.write(json.dumps({"world": ctx.world_size, "rank": ctx.rank, "epoch": epoch, "step": step + 1,
                                      "resumed_from": ctx.resumed_from_step,
                                      "ids": sample_ids(batch["input"].cpu())}) + "\n")
                out.flush()
                outputs, targets = ctx.task.forward(model, batch)
                loss = ctx.task.loss(outputs, targets)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                ctx.report(step, loss=loss.item())
                stop = ctx.should_stop()  # SIGTERM on any rank (an elastic gang's resize, a preemption)
                if stop or step % ctx.config.checkpoint.every_steps == 0:
                    ctx.save_checkpoint(step, {"model": ctx.full_state(model),
                                               "optimizer": ctx.full_optimizer_state(model, opt)})
                if stop:
                    return  # every step done so far is in that checkpoint
                if step >= ctx.total_steps:
                    break
    ctx.save_model(model)
