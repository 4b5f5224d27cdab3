"""A denoising autoencoder's own code, as a user writes it: a model factory, a task (loss, metric and
predictions for evaluation and serving) and a training function run on every rank with the
platform's TrainingContext. Imported by the training workers and by evaluation, never when
definitions load (it imports torch); pipelines/models/denoising.py names it by import path."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanSquaredError

from training_runtime.tasks.base import Task, TaskMetrics

NOISE = 0.5  # standard deviation of the Gaussian noise added to the (normalised) pixels


def autoencoder(input_shape, num_classes, hidden=16):
    d = math.prod(input_shape)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, hidden), nn.ReLU(),
                         nn.Linear(hidden, 128), nn.ReLU(), nn.Linear(128, num_classes))


class Reconstruction(Task):
    name, metric_names, monitor = "reconstruction", ("loss", "reconstruction_mse"), ("reconstruction_mse", "min")

    def num_outputs(self):
        return math.prod(self.info.input_shape)

    def forward(self, model, batch):  # evaluation: how well clean inputs come back
        x = batch["input"].flatten(1)
        return model(x), x

    def loss(self, outputs, targets):
        return F.mse_loss(outputs.float(), targets)

    def new_metrics(self, device):
        return ReconstructionMetrics({"mse": MeanSquaredError()}, device)

    def predict(self, outputs):
        return {"reconstruction": torch.as_tensor(outputs).detach().cpu().numpy()}


class ReconstructionMetrics(TaskMetrics):
    def update(self, outputs, targets):
        self.metrics["mse"].update(outputs.float(), targets)

    def compute(self):
        mse = float(self.metrics["mse"].compute())
        return {"loss": mse, "reconstruction_mse": mse}


def train(ctx):
    model = ctx.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=ctx.config.train.lr)
    noise = torch.Generator().manual_seed(ctx.config.train.seed * 1000 + ctx.rank)
    step = 0
    if (state := ctx.restore_checkpoint()) is not None:  # after a kill: carry on where it stopped
        ctx.load_state(model, opt, state["model"], state["optimizer"])
        noise.set_state(state["noise"][ctx.rank])
        step = state["step"]
    for _, batches in ctx.epochs(step):
        for batch in batches:
            clean = batch["input"].flatten(1)
            loss = F.mse_loss(model(clean + NOISE * torch.randn(clean.shape, generator=noise)), clean)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            ctx.report(step, loss=loss.item())
            stop = ctx.should_stop()  # preempted (SIGTERM): checkpoint, then return
            if step % ctx.config.checkpoint.every_steps == 0 or step == ctx.total_steps or stop:
                ctx.save_checkpoint(step, {"model": ctx.full_state(model), "optimizer": ctx.full_optimizer_state(model, opt),
                                           "noise": ctx.gather(noise.get_state())}, opt)
            if stop:
                return
            if step == ctx.total_steps:
                break
    ctx.report(step, validation_reconstruction_mse=ctx.evaluate(model)["reconstruction_mse"])
    ctx.save_model(model)
