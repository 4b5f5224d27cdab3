"""Variant (a) of the user-path matrix: a code location of the platform's own kind, built as
pipelines/definitions.py builds the platform's (``build_definitions``, location "platform"): the
wine pipeline with the built-in trainer, task and model, made small (a few epochs, one rank) and
given a sweep of two trials. The matrix's workspace.yaml names this module."""

import dataclasses

from core.sweep import Choice, Sweep
from pipelines.definitions import build_definitions
from pipelines.models.wine import wine_pipeline
from pipelines.profiles import Profile

wine = dataclasses.replace(
    wine_pipeline,
    recipe=dataclasses.replace(wine_pipeline.recipe, epochs=4, world_size=1, checkpoint_every_steps=4),
    sweep=Sweep(space={"train.seed": Choice(1, 2)}, objective="loss", trials=2, parallelism=2, sampler="grid",
                pruner="none"),
)

defs = build_definitions(Profile.from_environment(), [wine], with_yaml=False)
