"""A team's own training function for an elastic gang (``train_fn =
"tests.distributed.elastic_train:main"``): it resumes, checkpoints every checkpoint.every_steps,
stops at ``ctx.should_stop()`` (the SIGTERM a resize sends) after a checkpoint, and records which
samples each rank trains on, step by step (column 0 of every feature row is the sample's index /
ID_SCALE, as tests/runtime/sample_order_train.py reads it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tests.runtime.sample_order_train import sample_ids
from training_runtime.train.context import TrainingContext


def main(ctx: TrainingContext) -> None:
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

    def save() -> None:
        ctx.save_checkpoint(step, {"model": ctx.full_state(model), "optimizer": ctx.full_optimizer_state(model, opt)})

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
                if ctx.should_stop():  # the gang resizes: keep every step done so far
                    save()
                    return
                if step % ctx.config.checkpoint.every_steps == 0:
                    save()
                if step >= ctx.total_steps:
                    break
    ctx.save_model(model)
