"""The code location tests/k8s/test_step_pods.py runs: the shapes image dataset, its parts
sharded over steps (a few images a part, two parts a step, so a small folder makes several
steps), and a table (``ledger``: 32 rows a part, two parts a step), each with the local store on the shared folder and the kubernetes profile's executor, the
platform's own ``k8s_executor_config``. Only how the executor reaches the API server differs from
a cluster: a kubeconfig file (``KUBECONFIG``) instead of the pod's service account, and the API
client the test hands dagster-k8s (tests/k8s/step_pods.py). The step pods load this module as the
code-location image would load the platform's definitions."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import dagster as dg

from core.spec import ImageFolder, ImagePreprocessing, Source, dataset_pipeline
from pipelines.definitions import build_definitions, training_job_name
from pipelines.models.shapes import shapes_dataset
from pipelines.profiles import Profile
from resources.k8s.step_config import k8s_executor_config, platform_settings

SPEC = dataclasses.replace(shapes_dataset, source=ImageFolder(root="shapes", files_per_part=30, parts_per_step=2),
                           preprocessing=ImagePreprocessing(size=(32, 32)))

LEDGER = dataset_pipeline("ledger", source=Source(paths=("ledger/table.csv",), parts_per_step=2),
                          features=["f0", "f1", "f2", "f3"], label="label", classes=range(3), id_column="id",
                          split={"seed": 7, "samples_per_shard": 32})


@dataclasses.dataclass(frozen=True)
class StepPodsProfile(Profile):
    """Local resources (the store and artifacts as files on the volume every pod mounts) with the
    kubernetes profile's step executor."""

    def executor(self) -> dg.ExecutorDefinition:
        from dagster_k8s import k8s_job_executor

        config = k8s_executor_config(platform_settings(os.environ), runner_service_account="dagster")
        return k8s_job_executor.configured({**config, "load_incluster_config": False,
                                            "kubeconfig_file": os.environ.get("KUBECONFIG")})


def shapes_job() -> dg.JobDefinition:
    return _job(SPEC)


def ledger_job() -> dg.JobDefinition:
    return _job(LEDGER)


def _job(spec) -> dg.JobDefinition:
    profile = StepPodsProfile(name="local", data_root=Path(os.environ["DAGSTER_HOME"]) / "platform")
    return build_definitions(profile, [spec], with_yaml=False).resolve_job_def(training_job_name(spec))
