"""The Dagster instance the CLI reports to, and the events it reports there."""

from __future__ import annotations

import os

from pipelines.profiles import REPO_ROOT


def dagster_instance():
    """The Dagster instance at DAGSTER_HOME (the repository's dagster_home when unset, as `make` does)."""
    import dagster as dg

    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.from_config(str(REPO_ROOT / "dagster_home"))


def report_observation(model: str, description: str, metadata: dict) -> None:
    """Show an event in the history of ``<model>/model_version`` in the Dagster UI."""
    import dagster as dg

    with dagster_instance() as instance:
        instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=dg.AssetKey([model, "model_version"]), description=description, metadata=metadata))
