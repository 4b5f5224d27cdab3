"""The code location tests/k8s/test_text_step_pods.py runs: a text corpus whose parts are tokenized
over steps (a few documents a part, two parts a step, so a small corpus makes several steps) with
a BPE tokenizer, so the step pods must all encode with the one file the plan step trained and
staged. The resources and the executor are tests/k8s/step_pod_definitions.py's: the local store on
the shared folder and the kubernetes profile's ``k8s_job_executor``, the platform's own
``k8s_executor_config``. The step pods load this module as the code-location image would load the
platform's definitions."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from core.spec import TextCorpus, TextPreprocessing, dataset_pipeline
from pipelines.definitions import build_definitions, training_job_name
from tests.k8s.step_pod_definitions import StepPodsProfile

SPEC = dataset_pipeline(
    "notes", source=TextCorpus(paths=("notes/*.txt",), parts_per_step=2), task="language_modeling",
    split={"samples_per_shard": 8},
    preprocessing=TextPreprocessing(tokenizer="bpe", vocab_size=300, seq_len=12, part_documents=16))


def notes_job() -> dg.JobDefinition:
    profile = StepPodsProfile(name="local", data_root=Path(os.environ["DAGSTER_HOME"]) / "platform")
    return build_definitions(profile, [SPEC], with_yaml=False).resolve_job_def(training_job_name(SPEC))
