"""The code location of the Launchpad-override browser test (tests/ui/test_launchpad_override.py):
digits alone, trained briefly on one rank, so a run launched from the Launchpad ends in well under
a minute of training on two shared cores.

The gate is lowered because one epoch is enough to show an override in the lineage, not to
reach the production pipeline's accuracy bound; the learning rate stays the pipeline's (0.003),
so the override the test types (0.005) differs from it.
"""

from __future__ import annotations

import dataclasses

from pipelines.definitions import build_definitions
from core.sweep import Choice, LogRange, Sweep
from pipelines.models.digits import digits_pipeline
from pipelines.models.wine import wine_pipeline
from pipelines.profiles import Profile

QUICK_DIGITS = dataclasses.replace(
    digits_pipeline,
    recipe=dataclasses.replace(digits_pipeline.recipe, epochs=1, world_size=1),
    gate=dataclasses.replace(digits_pipeline.gate, min_test_accuracy=0.5),
)

# Wine with a three-trial sweep, two at a time, trained briefly: the trials table in the UI.
QUICK_WINE = dataclasses.replace(
    wine_pipeline,
    recipe=dataclasses.replace(wine_pipeline.recipe, epochs=3, world_size=1),
    gate=dataclasses.replace(wine_pipeline.gate, min_test_accuracy=0.0),
    sweep=Sweep(space={"train.lr": LogRange(1e-3, 1e-1), "model.hidden_sizes": Choice([16], [32])},
                objective="loss", trials=3, parallelism=2, startup_trials=1, seed=5),
)

defs = build_definitions(Profile.from_environment(), [QUICK_DIGITS, QUICK_WINE], with_yaml=False)
