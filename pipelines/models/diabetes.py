"""Disease progression one year after baseline from ten baseline measurements of 442 diabetes
patients (scikit-learn's bundled copy of Efron et al.'s data): a regression dataset, and an MLP
trained on it, gated on R².

The features come mean-centred and scaled (each column's sum of squares is 1, so values stay
within about +-0.2); the target is the progression score, 25 to 346 in the bundled copy.
"""

import pandas as pd

from pipelines.api import (
    QualitySuite, dataset_pipeline, model_pipeline, standard_raw_expectations, standard_shard_expectations)

FEATURES = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
TARGET = "target"
ID_COLUMN = "patient_id"


def load_diabetes_frame() -> pd.DataFrame:
    """The bundled data, with an id per patient (its row in the bundled file, which never changes)
    so the seeded split keeps every patient in the same split."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    frame.insert(0, ID_COLUMN, [f"diabetes-{i:03d}" for i in range(len(frame))])
    return frame


diabetes_dataset = dataset_pipeline(
    "diabetes", source=load_diabetes_frame, features=FEATURES, label=TARGET, task="regression",
    target_range=(0, 400), id_column=ID_COLUMN,
    expectations=QualitySuite(
        raw=lambda spec: standard_raw_expectations(spec, min_rows=400, value_range=(-1, 1)),
        shards=lambda spec: standard_shard_expectations(spec, max_abs_feature=10.0, max_fraction_error=0.08)),
    split={"seed": 0, "samples_per_shard": 128},
    description="Diabetes progression after one year (regression), from ten baseline measurements.",
)

diabetes_mlp = model_pipeline(
    "diabetes_mlp",
    dataset="diabetes",
    model="mlp",
    model_kwargs={"hidden_sizes": [32], "dropout": 0.1},
    recipe={"epochs": 40, "batch_size": 32, "lr": 0.003, "weight_decay": 0.01, "world_size": 2,
            "checkpoint_every_steps": 100, "monitor": "mae"},
    gate={"test_r2": {"min": 0.3}},
    description="An MLP predicting diabetes progression; trained on normalised targets, evaluated in the "
                "original units (MSE, MAE, R²); the best validation MAE's weights registered.",
)
