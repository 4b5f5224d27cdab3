"""The soak's code locations' resources: the lakeFS test server (behind its fault proxy) as the
store, SeaweedFS as the artifact store, and the local torchrun launcher, or for the Kubernetes
path the Kubernetes launcher against the pod simulation (cluster.py). The webserver and daemon
get the endpoints from the environment the soak starts them with (platform.py); the locations
read it when Dagster loads them, in one place, here."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Mapping

import dagster as dg

from pipelines.profiles import Profile
from resources.platform import ArtifactStoreResource, PlatformSettings, VersionedStoreResource

LOCAL, KUBERNETES = "local", "simulated-kubernetes"  # SOAK_LAUNCHER
REPOSITORY = "soak"
ENV = ("SOAK_DATA_ROOT", "SOAK_LAKEFS_ENDPOINT", "SOAK_LAKEFS_ACCESS_KEY_ID", "SOAK_LAKEFS_SECRET_ACCESS_KEY",
       "SOAK_S3_ENDPOINT", "SOAK_S3_BUCKET", "SOAK_LAUNCHER")


@dataclasses.dataclass(frozen=True)
class SoakProfile(Profile):
    """A local profile (in-process steps, the local instance) whose resources are the soak's."""

    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def resources(self) -> dict[str, dg.ConfigurableResource]:
        s = self.settings
        launcher: dg.ConfigurableResource
        if s["SOAK_LAUNCHER"] == KUBERNETES:
            from tests.reliability.soak.cluster import SimulatedClusterLauncherResource

            launcher = SimulatedClusterLauncherResource(kind="kubernetes", work_root=str(self.data_root),
                                                        cluster_root=str(self.data_root / "cluster"))
        else:
            from resources.platform import TrainingLauncherResource

            launcher = TrainingLauncherResource(kind="local", work_root=str(self.data_root / "launches"),
                                                python_path=list(self.code_paths))
        return {
            "platform": PlatformSettings(data_root=str(self.data_root)),
            "store": VersionedStoreResource(
                kind="lakefs", repository=REPOSITORY, lakefs_endpoint=s["SOAK_LAKEFS_ENDPOINT"],
                lakefs_access_key_id=s["SOAK_LAKEFS_ACCESS_KEY_ID"],
                lakefs_secret_access_key=dg.EnvVar("SOAK_LAKEFS_SECRET_ACCESS_KEY"),
                lakefs_storage_namespace=f"local://{REPOSITORY}"),
            "artifacts": ArtifactStoreResource(kind="s3", bucket=s["SOAK_S3_BUCKET"], prefix="artifacts",
                                               endpoint_url=s["SOAK_S3_ENDPOINT"]),
            "launcher": launcher,
        }


def soak_profile(environ: Mapping[str, str] | None = None) -> SoakProfile:
    environ = os.environ if environ is None else environ
    missing = [k for k in ENV if not environ.get(k)]
    if missing:
        raise RuntimeError(f"the soak's code locations need {', '.join(missing)} in their environment; they are "
                           "loaded by the webserver and daemon that tests/reliability/soak/platform.py starts")
    return SoakProfile(name="local", data_root=Path(environ["SOAK_DATA_ROOT"]),
                       settings={k: environ[k] for k in ENV})


# An elastic gang's trainings on the Kubernetes path last this many epochs instead of the
# pipeline's own: a gang that loses a node re-forms after the rendezvous lease (about 15 s) and
# grows back when the replacement pod, started ELASTIC_REPLACEMENT_S later (cluster.py), joins,
# so a training must outlive the loss by about a minute for the soak to see both resizes.
ELASTIC_EPOCHS = 40


def recipe_shape(environ: Mapping[str, str] | None = None, *, elastic: bool = False) -> dict[str, int]:
    """Two ranks: two processes on one machine locally, two pods of one process on Kubernetes
    (so that a lost node takes a rank with it). ``elastic``: on Kubernetes, a gang of 1-2 pods
    (``min_nodes`` 1) that goes on when a pod is lost and grows back when its replacement joins;
    each lost pod uses one of ``max_restarts``, so it has room for several faults in one run.
    Locally the gang stays one node of two processes (the local soak's classes are a rank's)."""
    environ = os.environ if environ is None else environ
    if environ.get("SOAK_LAUNCHER") != KUBERNETES:
        return {"world_size": 2}
    if elastic:
        return {"world_size": 1, "nnodes": 2, "min_nodes": 1, "max_restarts": 6, "epochs": ELASTIC_EPOCHS}
    return {"world_size": 1, "nnodes": 2}
