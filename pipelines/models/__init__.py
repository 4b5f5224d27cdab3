"""The model pipelines written in Python. Add a module here and list it in PIPELINES; pipelines
declared in YAML live under pipelines/defs/ (see pipelines/components)."""

from pipelines.models.digits import digits_pipeline
from pipelines.models.wine import wine_pipeline

PIPELINES = [digits_pipeline, wine_pipeline]
