"""A denoising autoencoder on the digits' pixels, trained by its own loop: the pipeline names a
model factory, a task and a training function by import path (training_runtime/examples/denoising.py,
plain PyTorch that the training image holds), and trains on the digits pipeline's shards."""

from pipelines.api import model_pipeline

CODE = "training_runtime.examples.denoising"

digits_denoiser = model_pipeline(
    "digits_denoiser",
    dataset="digits",
    model=f"{CODE}:autoencoder",
    model_kwargs={"hidden": 16},
    task=f"{CODE}:Reconstruction",
    train=f"{CODE}:train",
    recipe={"epochs": 8, "batch_size": 32, "lr": 0.003, "world_size": 2, "checkpoint_every_steps": 40},
    gate={"test_reconstruction_mse": {"max": 0.6}},
    description="Digits with Gaussian noise in, clean digits out; scored by reconstruction MSE on normalised pixels.",
)
