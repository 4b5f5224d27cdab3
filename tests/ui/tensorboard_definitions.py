"""The code location of the live-TensorBoard browser test (tests/ui/test_live_tensorboard.py):
digits alone, with the live-plots recipe (tests/ui/live_definitions.py: small batches and a wide
MLP, so each step costs tens of milliseconds) for three epochs: about 1,050 steps, which take
half a minute on two idle cores (longer when they are shared), with a telemetry interval every
10 steps."""

from __future__ import annotations

import dataclasses

from pipelines.definitions import build_definitions
from pipelines.models.digits import digits_pipeline
from pipelines.profiles import Profile

TENSORBOARD_DIGITS = dataclasses.replace(
    digits_pipeline,
    model_kwargs={"hidden_sizes": [1024, 1024]},
    recipe=dataclasses.replace(digits_pipeline.recipe, epochs=3, batch_size=4, checkpoint_every_steps=400),
)

defs = build_definitions(Profile.from_environment(), [TENSORBOARD_DIGITS], with_yaml=False)
