"""The model pipelines this code location serves. Add a module here and list it in PIPELINES."""

from pipelines.models.digits import digits_pipeline

PIPELINES = [digits_pipeline]
