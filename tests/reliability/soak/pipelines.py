"""The soak's pipelines, tiny so that many runs fit in its time: digits (the platform location's
own dataset, retrained on every new-data commit, two ranks, async full checkpoints; on the
Kubernetes path an elastic gang of 1-2 pods, trained longer: profile.recipe_shape) and wine
(a sweep of two one-rank trials run in parallel). Two ranks are two processes locally and two
pods on the Kubernetes path (profile.recipe_shape). The team location's pipeline trains on digits as
published (team_package/definitions.py).

Guards and timeouts are short so a hung rank is found within the soak: the watchdog fires after
30 s without a step (the steps take milliseconds), well below the 90 s collective timeout."""

from __future__ import annotations

from pipelines.api import Choice, Sweep, model_pipeline
from pipelines.models import digits_expectations
from pipelines.models.digits import PIXELS
from pipelines.models.wine import FEATURES as WINE_FEATURES, load_wine_frame
from tests.reliability.soak.profile import recipe_shape

DIGITS_SOURCE = "digits/digits.csv"  # under the store's sources/ area, replaced by each new-data commit
HANG_TIMEOUT_S = 30.0
COLLECTIVE_TIMEOUT_S = 90.0
PLATFORM_LOCATION = "platform"  # the team's dataset_location names it
TEAM_LOCATION, TEAM_MODEL = "soakteam", "digits_team"

DIGITS = model_pipeline(
    "digits", description="Soak: an MLP on 8x8 digits, retrained on every new-data commit.",
    source=DIGITS_SOURCE, features=PIXELS, label="label", id_column="image_id", classes=range(10),
    expectations=digits_expectations.suite, model="mlp", model_kwargs={"hidden_sizes": [256, 128]},
    recipe={"epochs": 2, "batch_size": 64, "lr": 0.01, **recipe_shape(elastic=True), "checkpoint_every_steps": 3,
            "keep_last_checkpoints": 2, "async_checkpoint": True, "collective_timeout_s": COLLECTIVE_TIMEOUT_S},
    guards={"hang_timeout_s": HANG_TIMEOUT_S},
    gate={"min_test_accuracy": 0.5}, split={"seed": 0, "samples_per_shard": 256},
    triggers={"on_new_data": True, "sensor_interval_s": 5, "active": True},
)

WINE = model_pipeline(
    "wine", description="Soak: a sweep of two wine MLPs trained at once.",
    source=load_wine_frame, features=WINE_FEATURES, label="cultivar", classes=range(3), id_column="sample_id",
    model="mlp", model_kwargs={"hidden_sizes": [16]},
    recipe={"epochs": 6, "batch_size": 16, "lr": 0.01, "world_size": 1, "checkpoint_every_steps": 5,
            "keep_last_checkpoints": 2, "collective_timeout_s": COLLECTIVE_TIMEOUT_S},
    guards={"hang_timeout_s": HANG_TIMEOUT_S},
    gate={"min_test_accuracy": 0.5}, split={"seed": 1, "samples_per_shard": 64},
    triggers={"on_new_data": False}, team="oenology",
    sweep=Sweep(space={"train.seed": Choice(1, 2)}, objective="loss", trials=2, parallelism=2, sampler="grid",
                pruner="none"),
)

# (location, job) of each pipeline the soak starts runs of by itself (the others' sensors start theirs).
JOBS = {"digits": (PLATFORM_LOCATION, "digits_training"), "wine": (PLATFORM_LOCATION, "wine_training"),
        TEAM_MODEL: (TEAM_LOCATION, f"{TEAM_MODEL}_training")}
