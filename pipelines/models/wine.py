"""Wine cultivars from 13 chemical measurements (scikit-learn's bundled UCI wine data, 178 samples)."""

import pandas as pd

from pipelines.api import (
    Choice,
    LogRange,
    QualitySuite,
    Sweep,
    model_pipeline,
    standard_raw_expectations,
    standard_shard_expectations,
)

FEATURES = ("alcohol", "malic_acid", "ash", "alcalinity_of_ash", "magnesium", "total_phenols", "flavanoids",
            "nonflavanoid_phenols", "proanthocyanins", "color_intensity", "hue",
            "od280/od315_of_diluted_wines", "proline")


def load_wine_frame() -> pd.DataFrame:
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame.rename(columns={"target": "cultivar"})
    frame.insert(0, "sample_id", [f"wine-{i:03d}" for i in range(len(frame))])
    return frame


wine_pipeline = model_pipeline(
    "wine", source=load_wine_frame, features=FEATURES, label="cultivar", classes=range(3), id_column="sample_id",
    expectations=QualitySuite(
        raw=lambda spec: standard_raw_expectations(spec, min_rows=150, value_range=(0, 2000), min_class_share=0.2),
        shards=lambda spec: standard_shard_expectations(spec, max_fraction_error=0.08)),
    model="mlp", model_kwargs={"hidden_sizes": [32]},
    recipe={"epochs": 30, "batch_size": 16, "lr": 0.01, "world_size": 2, "checkpoint_every_steps": 100},
    gate={"min_test_accuracy": 0.8}, split={"seed": 1, "samples_per_shard": 64},
    triggers={"cron": "30 3 * * *"}, team="oenology", description="An MLP telling three wine cultivars apart.",
    # Every training of wine is a small search: 6 trials, 2 at a time; a trial whose validation
    # loss trails the median of the trials before it at the same validation stops early.
    sweep=Sweep(space={"train.lr": LogRange(1e-3, 1e-1), "model.hidden_sizes": Choice([16], [32], [64])},
                objective="loss", trials=6, parallelism=2, sampler="tpe", pruner="median",
                startup_trials=2, prune_after_validations=3),
)
