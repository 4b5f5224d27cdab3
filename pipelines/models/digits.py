"""The demo model: handwritten digits (scikit-learn's bundled copy of the UCI data, 1,797 8x8 images)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from assets.spec import PipelineSpec, QualityGate, Recipe, Source, Split

PIXELS = tuple(f"pixel_{i}" for i in range(64))
SOURCE_FILE = "digits/digits.csv"


def write_digits_source(sources_root: Path) -> Path:
    """Write the digits data as a CSV source file, as a user would bring one (once)."""
    from sklearn.datasets import load_digits

    path = sources_root / SOURCE_FILE
    if path.exists():
        return path
    digits = load_digits()
    frame = pd.DataFrame(digits.data, columns=list(PIXELS))
    frame.insert(0, "image_id", [f"digit-{i:05d}" for i in range(len(frame))])
    frame["label"] = digits.target
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame.to_csv(tmp, index=False)
    tmp.rename(path)
    return path


digits_pipeline = PipelineSpec(
    name="digits",
    description="An MLP that reads 8x8 handwritten digits.",
    source=Source(paths=(SOURCE_FILE,)),
    feature_columns=PIXELS,
    label_column="label",
    id_column="image_id",
    class_names=tuple(str(d) for d in range(10)),
    model="mlp",
    model_kwargs={"hidden_sizes": [128, 64]},
    recipe=Recipe(epochs=8, batch_size=32, lr=0.003, optimizer="adamw", world_size=2,
                  checkpoint_every_steps=40, seed=0),
    gate=QualityGate(min_test_accuracy=0.9),
    split=Split(seed=0, samples_per_shard=256),
)
