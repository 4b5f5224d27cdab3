"""The Dagster instance the CLI reports to, and the events it reports there."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipelines.profiles import REPO_ROOT, Profile, ensure_instance_config


def instance_home() -> Path:
    """DAGSTER_HOME, or the repository's dagster_home when unset (as `make` sets it)."""
    return Path(os.environ.get("DAGSTER_HOME") or REPO_ROOT / "dagster_home").absolute()


def dagster_instance():
    """The Dagster instance at ``instance_home()``. On the local profile an empty or missing home
    first gets the platform's instance config (run queue, per-model and per-team limits, run
    retries, the GPU pool: a copy of dagster_home/dagster.yaml); a home with a dagster.yaml is used
    as it is. On Kubernetes the deployment's home is used as it is."""
    import dagster as dg

    home = instance_home()
    if Profile.from_environment().name == "local" and ensure_instance_config(home):
        print(f"note: {home} had no dagster.yaml; wrote the platform's local instance config there "
              "(a copy of dagster_home/dagster.yaml)", file=sys.stderr)
    return dg.DagsterInstance.from_config(str(home))


def report_observation(model: str, description: str, metadata: dict) -> None:
    """Show an event in the history of ``<model>/model_version`` in the Dagster UI."""
    import dagster as dg

    with dagster_instance() as instance:
        instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=dg.AssetKey([model, "model_version"]), description=description, metadata=metadata))
