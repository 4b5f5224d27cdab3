"""A temporary local platform: instance, store and state under tmp_path, never the repo's."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from pipelines.definitions import build_definitions, training_job_name
from pipelines.profiles import Profile


class Platform:
    def __init__(self, root: Path):
        self.root = root
        self.profile = Profile(name="local", data_root=root / "platform")
        (root / "dagster_home").mkdir(parents=True, exist_ok=True)
        self.instance = dg.DagsterInstance.local_temp(str(root / "dagster_home"))

    @property
    def sources(self) -> Path:
        return self.profile.data_root / "sources"

    def store(self):
        return self.profile.store()

    def run(self, spec, specs=None, raise_on_error=False, tags=None, with_yaml=False) -> dg.ExecuteInProcessResult:
        defs = build_definitions(self.profile, specs or [spec], with_yaml=with_yaml)
        job = defs.resolve_job_def(training_job_name(spec))
        return job.execute_in_process(instance=self.instance, raise_on_error=raise_on_error, tags=tags)

    def run_assets(self, spec, stages, specs=None, tags=None) -> dg.ExecuteInProcessResult:
        """Only some of the pipeline's assets (e.g. ["raw_dataset"]), through its training job."""
        defs = build_definitions(self.profile, specs or [spec], with_yaml=False)
        job = defs.resolve_job_def(training_job_name(spec))
        return job.execute_in_process(instance=self.instance, raise_on_error=False, tags=tags,
                                      asset_selection=[dg.AssetKey([spec.name, s]) for s in stages])


@pytest.fixture
def platform(tmp_path):
    p = Platform(tmp_path)
    with p.instance:  # disposes it, and resets the instance Dagster keeps as the current one
        yield p


def failure_messages(result: dg.ExecuteInProcessResult) -> str:
    return "\n".join(e.event_specific_data.error.message for e in result.all_events if e.is_step_failure)
