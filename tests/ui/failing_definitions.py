"""The code location of the failed-run browser test (tests/ui/test_failed_run.py): digits alone,
with a learning rate that makes the loss non-finite at its second step, a failure that a retry
cannot fix (the runtime's non-finite guard stops the training; the op fails it, not retried)."""

from __future__ import annotations

import dataclasses

from pipelines.definitions import build_definitions
from pipelines.models.digits import digits_pipeline
from pipelines.profiles import Profile

DIVERGING_DIGITS = dataclasses.replace(
    digits_pipeline,
    recipe=dataclasses.replace(digits_pipeline.recipe, epochs=1, lr=1e37, checkpoint_every_steps=1),
)

defs = build_definitions(Profile.from_environment(), [DIVERGING_DIGITS], with_yaml=False)
