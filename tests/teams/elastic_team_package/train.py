"""The relay team's training loop: SGD on the context's batches, a checkpoint every few steps and
whenever the context says to stop (an elastic gang's resize), the model saved at the end. Each
step's samples (their ``key`` feature, as the shards hold it) go to ``seen/`` beside the
checkpoints, one file per rank and process, so the team can check what every rank trained on."""

import json
import os
from pathlib import Path

import torch


def fit(ctx):
    seen = Path(ctx.config.checkpoint.dir).parent / "seen"
    seen.mkdir(parents=True, exist_ok=True)
    log = seen / f"w{ctx.world_size}-r{ctx.rank}-pid{os.getpid()}.jsonl"
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=ctx.config.train.lr)
    step = 0
    if (state := ctx.restore_checkpoint()) is not None:  # a restarted or resized attempt carries on
        ctx.load_state(model, opt, state["model"], state["optimizer"])
        step = state["step"]
    with log.open("a") as out:
        for epoch, batches in ctx.epochs(step):
            for batch in batches:
                keys = batch["input"][:, 0].double().cpu().tolist()
                out.write(json.dumps({"world": ctx.world_size, "rank": ctx.rank, "epoch": epoch, "step": step + 1,
                                      "resumed_from": ctx.resumed_from_step, "ids": keys}) + "\n")
                out.flush()
                outputs, targets = ctx.task.forward(model, batch)
                loss = ctx.task.loss(outputs, targets)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                ctx.report(step, loss=loss.item())
                stop = ctx.should_stop()
                if stop or step % ctx.config.checkpoint.every_steps == 0:
                    ctx.save_checkpoint(step, {"model": ctx.full_state(model),
                                               "optimizer": ctx.full_optimizer_state(model, opt)})
                if stop:
                    return  # every step so far is in that checkpoint
                if step >= ctx.total_steps:
                    break
    ctx.save_model(model)
