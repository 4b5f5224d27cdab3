"""The code location tests/k8s/test_table_ingest_pods.py runs: a table of several source files
(``events``), one file an ingest step, with the step pods' profile of
tests/k8s/step_pod_definitions.py (the kubernetes profile's executor, the local store on the
shared folder). The step pods load this module as the code-location image would load the
platform's definitions."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from core.spec import Source, dataset_pipeline
from pipelines.definitions import build_definitions, training_job_name
from tests.k8s.step_pod_definitions import StepPodsProfile

EVENTS = dataset_pipeline("events", source=Source(paths=("events/*.csv",), chunk_mb=0.002, files_per_step=1),
                          features=["f0", "f1", "f2", "f3"], label="label", classes=range(3), id_column="id",
                          split={"seed": 7, "samples_per_shard": 64})


def events_job() -> dg.JobDefinition:
    profile = StepPodsProfile(name="local", data_root=Path(os.environ["DAGSTER_HOME"]) / "platform")
    return build_definitions(profile, [EVENTS], with_yaml=False).resolve_job_def(training_job_name(EVENTS))
