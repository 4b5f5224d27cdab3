"""The vision team's code location (``location_name: vision`` in workspace.yaml).

A wider MLP trained on the digits dataset that the platform's own location publishes: the team
edits nothing of the platform, imports only ``pipelines.api``, and reads digits as published on
main (the newest version, or the one ``dataset_version`` pins). Its sensor, once started in the
UI, retrains it whenever the platform publishes a new digits version.
"""

from pipelines.api import model_pipeline, team_definitions

digits_wide = model_pipeline(
    "digits_wide",
    dataset="digits",
    dataset_location="platform",
    model="mlp",
    model_kwargs={"hidden_sizes": [256, 128]},
    recipe={"epochs": 6, "batch_size": 64, "lr": 0.003, "world_size": 2, "checkpoint_every_steps": 40},
    gate={"min_test_accuracy": 0.9},
    triggers={"on_new_data": True},
    team="vision",
    description="A wider MLP on the platform's published digits dataset.",
)

defs = team_definitions("vision", [digits_wide])
