"""Training functions as users write them (``train_fn = "tests.runtime.user_train:main"``), and
ones that break the contract, for the tests of ``training_runtime.train.user_loop``."""

from __future__ import annotations

import torch

from training_runtime.train.context import TrainingContext


def main(ctx: TrainingContext) -> None:
    """A plain SGD loop on the context's batches: resume, step, report, checkpoint, stop on SIGTERM."""
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=ctx.config.train.lr, momentum=0.9)
    step = 0
    state = ctx.restore_checkpoint()
    if state is not None:
        ctx.load_state(model, opt, state["model"], state["optimizer"])
        step = state["step"]
    for _, batches in ctx.epochs(step):
        for batch in batches:
            outputs, targets = ctx.task.forward(model, batch)
            loss = ctx.task.loss(outputs, targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            ctx.report(step, loss=loss.item())
            if step % ctx.config.checkpoint.every_steps == 0 or ctx.should_stop():
                ctx.save_checkpoint(step, {"model": ctx.full_state(model),
                                           "optimizer": ctx.full_optimizer_state(model, opt)})
            if step >= ctx.total_steps:
                break
    ctx.report(step, **{f"validation_{k}": v for k, v in ctx.evaluate(model).items() if isinstance(v, float)})
    ctx.save_model(model)


def never_reports(ctx: TrainingContext) -> None:
    ctx.save_model(ctx.build_model())


def never_saves_a_model(ctx: TrainingContext) -> None:
    ctx.report(0, loss=1.0)


def takes_no_context() -> None:
    pass
