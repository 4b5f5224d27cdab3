"""The code location of the sweep-kill test (tests/experiments/test_sweep_worker_kill.py): the
platform's own wine pipeline, as pipelines/definitions.py builds it, made small (6 epochs, one
rank) with a sweep of 6 trials, 2 at a time, whose grid holds a learning rate that learns nothing,
so the median pruner stops such a trial after its first validations (issue 45's case: two trials
finished, one pruned, one training, when the run worker dies)."""

import dataclasses

from core.sweep import Choice, Sweep
from pipelines.definitions import build_definitions
from pipelines.models.wine import wine_pipeline
from pipelines.profiles import Profile

# Grid order with seed 1: lr 0.03, 0.05, 1e-06, 0.05, 0.03, 1e-06 (trials 2 and 5 are pruned).
SWEEP = Sweep(space={"train.lr": Choice(0.05, 0.03, 1e-6), "train.seed": Choice(1, 2)}, objective="loss",
              trials=6, parallelism=2, sampler="grid", pruner="median", startup_trials=2, prune_after_validations=1,
              seed=1)

wine = dataclasses.replace(
    wine_pipeline,
    recipe=dataclasses.replace(wine_pipeline.recipe, epochs=6, world_size=1, checkpoint_every_steps=4),
    gate=dataclasses.replace(wine_pipeline.gate, min_test_accuracy=0.0),
    sweep=SWEEP,
)

defs = build_definitions(Profile.from_environment(), [wine], with_yaml=False)
