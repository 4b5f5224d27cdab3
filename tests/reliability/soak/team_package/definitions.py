"""The soakteam location: a model on the digits dataset that the platform location publishes,
retrained by its sensor whenever a new digits version is published. Two ranks under FSDP, so its
checkpoints are sharded (each rank writes its DCP shards). Besides ``pipelines.api`` it imports
the soak's profile, since the soak's store and artifact store are test servers."""

from pipelines.api import model_pipeline, team_definitions
from tests.reliability.soak.pipelines import COLLECTIVE_TIMEOUT_S, HANG_TIMEOUT_S, PLATFORM_LOCATION, TEAM_LOCATION, TEAM_MODEL
from tests.reliability.soak.profile import recipe_shape, soak_profile

digits_team = model_pipeline(
    TEAM_MODEL, dataset="digits", dataset_location=PLATFORM_LOCATION, model="mlp",
    model_kwargs={"hidden_sizes": [32]},
    recipe={"epochs": 2, "batch_size": 64, "lr": 0.01, **recipe_shape(), "sharding": "fsdp",
            "checkpoint_every_steps": 3, "keep_last_checkpoints": 2, "collective_timeout_s": COLLECTIVE_TIMEOUT_S},
    guards={"hang_timeout_s": HANG_TIMEOUT_S},
    gate={"min_test_accuracy": 0.5}, triggers={"on_new_data": True, "sensor_interval_s": 5, "active": True},
    team=TEAM_LOCATION, description="Soak: a team's FSDP MLP on the platform's published digits.")

defs = team_definitions(TEAM_LOCATION, [digits_team], profile=soak_profile())
