"""The cellar team's code location: its own dataset (iris, from scikit-learn) and a model on it
with its own training function and its own task, and a sweep of two trials. It imports only
``pipelines.api``."""

from pipelines.api import Choice, Sweep, dataset_pipeline, model_pipeline, team_definitions

FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def load_iris_frame():
    from sklearn.datasets import load_iris

    data = load_iris(as_frame=True)
    frame = data.frame.rename(columns={**dict(zip(data.feature_names, FEATURES)), "target": "species"})
    frame.insert(0, "flower_id", [f"iris-{i:03d}" for i in range(len(frame))])
    return frame.drop_duplicates(subset=list(FEATURES))  # one flower is measured twice; the checks refuse that


flowers = dataset_pipeline(
    "flowers", source=load_iris_frame, features=FEATURES, label="species", classes=range(3), id_column="flower_id",
    split={"seed": 0, "samples_per_shard": 64}, description="Iris flowers (scikit-learn's bundled data).")

# A task of one's own trains on a dataset pipeline's shards (the dataset says what its targets are).
iris = model_pipeline(
    "iris", dataset="flowers", model="mlp", model_kwargs={"hidden_sizes": [16]},
    task="cellar.task:SmoothedClassification", train="cellar.train:fit",
    recipe={"epochs": 4, "batch_size": 16, "lr": 0.02, "world_size": 1, "checkpoint_every_steps": 4},
    gate={"test_accuracy": {"min": 0.6}},
    sweep=Sweep(space={"train.seed": Choice(1, 2)}, objective="loss", trials=2, parallelism=2, sampler="grid",
                pruner="none"),
    description="An MLP on iris, trained by the team's own loop with label smoothing.",
)

defs = team_definitions("cellar", [flowers, iris])
