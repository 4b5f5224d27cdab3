"""The cellar team's training loop: AdamW on the context's batches, a checkpoint every few steps
(so a killed rank resumes), a validation per epoch for the sweep, and the model saved at the end."""

import torch


def fit(ctx):
    model = ctx.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=ctx.config.train.lr, weight_decay=0.0)
    step = 0
    if (state := ctx.restore_checkpoint()) is not None:  # a restarted attempt carries on
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
            stop = ctx.should_stop()
            if step % ctx.config.checkpoint.every_steps == 0 or step == ctx.total_steps or stop:
                ctx.save_checkpoint(step, {"model": ctx.full_state(model),
                                           "optimizer": ctx.full_optimizer_state(model, opt)})
            if stop:
                return
            if step == ctx.total_steps:
                break
        validation = ctx.evaluate(model)
        ctx.report_validation(step, validation)
        ctx.report(step, validation_loss=validation["loss"], validation_accuracy=validation["accuracy"])
    ctx.save_model(model)
