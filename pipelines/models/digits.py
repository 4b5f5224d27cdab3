"""The demo model: handwritten digits (scikit-learn's bundled copy of the UCI data, 1,797 8x8 images)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipelines.api import model_pipeline
from pipelines.models import digits_expectations
from training_runtime.atomic_files import atomic_path

PIXELS = tuple(f"pixel_{i}" for i in range(64))
SOURCE_FILE = "digits/digits.csv"


def digits_frame() -> pd.DataFrame:
    """The digits data in the shape users bring it: image_id, pixel_0..pixel_63, label."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(digits.data, columns=list(PIXELS))
    frame.insert(0, "image_id", [f"digit-{i:05d}" for i in range(len(frame))])
    frame["label"] = digits.target
    return frame


def write_digits_source(sources_root: Path) -> Path:
    """Write the digits data as a CSV source file, as a user would bring one (once)."""
    path = sources_root / SOURCE_FILE
    if path.exists():
        return path
    with atomic_path(path) as tmp:  # a crash mid-write leaves no partial CSV that looks written
        digits_frame().to_csv(tmp, index=False)
    return path


digits_pipeline = model_pipeline(
    "digits",
    description="An MLP that reads 8x8 handwritten digits.",
    source=SOURCE_FILE,
    features=PIXELS,
    label="label",
    id_column="image_id",
    classes=range(10),
    expectations=digits_expectations.suite,
    model="mlp",
    model_kwargs={"hidden_sizes": [128, 64]},
    recipe={"epochs": 8, "batch_size": 32, "lr": 0.003, "optimizer": "adamw", "world_size": 2,
            "checkpoint_every_steps": 40, "seed": 0},
    gate={"min_test_accuracy": 0.9},
    split={"seed": 0, "samples_per_shard": 256},
    triggers={"cron": "0 3 * * 1"},
)
