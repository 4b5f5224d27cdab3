"""The code location of the live-plots browser test (tests/ui/test_live_plots.py): digits alone,
with a recipe slow enough to watch on two shared cores.

Small batches make many steps (telemetry goes out every 10, the runtime's default), and a wide MLP
makes each step cost tens of milliseconds, so the training lasts a minute or two and its telemetry
arrives about a point a second instead of all at once.
"""

from __future__ import annotations

import dataclasses

from pipelines.definitions import build_definitions
from pipelines.models.digits import digits_pipeline
from pipelines.profiles import Profile

LIVE_DIGITS = dataclasses.replace(
    digits_pipeline,
    model_kwargs={"hidden_sizes": [1024, 1024]},
    recipe=dataclasses.replace(digits_pipeline.recipe, epochs=3, batch_size=4, checkpoint_every_steps=400),
)

defs = build_definitions(Profile.from_environment(), [LIVE_DIGITS], with_yaml=False)
