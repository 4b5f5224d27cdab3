"""One temporary platform with two real digits versions, shared by the CLI, UI and notebook tests.

Version 1 trains on the full digits data; version 2 on the data with its first 97 rows dropped
and with another seed, learning rate and epoch count, so ``compare`` and ``diff`` have real
differences to show. Both runs are real Dagster runs with real torchrun (2 gloo ranks) on a
temporary ``DAGSTER_HOME``; the CLI sees them exactly as after ``python -m pipelines demo``.

pytest registers a fixture once per conftest, so the three test packages share the platform
through ``shared_demo_platform``, which builds it once per session. To iterate on these tests
without paying for the two runs each time, build a platform once
(``python -m tests.cli.demo_platform DIR``) and point ``MODEL_FACTORY_DEMO_HOME`` at ``DIR``:
each session then works on a fresh copy of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pandas as pd

from core.spec import PipelineSpec
from pipelines.definitions import build_definitions, training_job_name
from pipelines.models.digits import digits_pipeline, write_digits_source
from pipelines.profiles import Profile

REPO = Path(__file__).resolve().parents[2]
DROPPED_ROWS = 97

# Small recipes keep the session fixture near a minute on two shared cores.
FIRST = dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, epochs=3))
SECOND = dataclasses.replace(
    digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, epochs=4, seed=1, lr=0.005))


@dataclasses.dataclass
class DemoPlatform:
    home: Path  # DAGSTER_HOME
    run_ids: list[str]

    @property
    def profile(self) -> Profile:
        return Profile(name="local", data_root=self.home / "platform")

    def store(self):
        return self.profile.store()

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE")}
        env.update(DAGSTER_HOME=str(self.home), PYTHONPATH=str(REPO), **extra)
        return env

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``python -m pipelines ARGS`` as a user runs it, against this platform."""
        return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=REPO, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)


# No network here; runs submitted to the webserver launch at once (no daemon to dequeue them).
INSTANCE_YAML = """\
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""


def write_instance_config(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(INSTANCE_YAML)


def run_pipeline(home: Path, spec: PipelineSpec) -> str:
    profile = Profile(name="local", data_root=home / "platform")
    # Only this pipeline: not the YAML pipelines that share its dataset (they would train too).
    job = build_definitions(profile, [spec], with_yaml=False).resolve_job_def(training_job_name(spec))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    if not result.success:
        errors = [e.event_specific_data.error.message for e in result.all_events if e.is_step_failure]
        raise RuntimeError(f"demo run of {spec.name} failed: {' | '.join(errors)}")
    return result.run_id


def build_demo_platform(home: Path) -> DemoPlatform:
    write_instance_config(home)
    source = write_digits_source(home / "platform" / "sources")
    first = run_pipeline(home, FIRST)
    frame = pd.read_csv(source)
    frame.iloc[DROPPED_ROWS:].to_csv(source, index=False)
    second = run_pipeline(home, SECOND)
    (home / "demo_runs.json").write_text(json.dumps([first, second]))
    return DemoPlatform(home=home, run_ids=[first, second])


_BUILT: dict[str, DemoPlatform] = {}


def _built_for_all_workers(tmp_path_factory) -> Path | None:
    """Under pytest-xdist, the platform the session's first worker to need it built, in the temp
    folder the workers share (``basetemp``'s parent), under a lock that holds the others until it
    is there: each worker is its own process, and building it twice cost a minute of a 2-core
    make test. None outside xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent / "demo-platform"
    shared.mkdir(exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        home = shared / "home"
        if not (home / "demo_runs.json").exists():  # written last: a half-built home is rebuilt
            if home.exists():
                shutil.rmtree(home)
            build_demo_platform(home)
    return home


def shared_demo_platform(tmp_path_factory) -> DemoPlatform:
    if "platform" not in _BUILT:
        home = tmp_path_factory.mktemp("demo") / "home"
        prebuilt = os.environ.get("MODEL_FACTORY_DEMO_HOME") or _built_for_all_workers(tmp_path_factory)
        if prebuilt:
            shutil.copytree(prebuilt, home)
            _BUILT["platform"] = DemoPlatform(home=home, run_ids=json.loads((home / "demo_runs.json").read_text()))
        else:
            _BUILT["platform"] = build_demo_platform(home)
        # The docs' example tests compare their output with the platform as built; the tests here
        # comment, promote and reproduce on this one, so they get an untouched copy.
        shutil.copytree(home, home.parent / "pristine", symlinks=True)
    return _BUILT["platform"]


def pristine_demo_home(tmp_path_factory) -> Path:
    """A copy of the shared platform's home as it was built, before any test changed it."""
    return shared_demo_platform(tmp_path_factory).home.parent / "pristine"


if __name__ == "__main__":
    # Build a platform for trying the CLI by hand: python -m tests.cli.demo_platform DIR
    built = build_demo_platform(Path(sys.argv[1]).resolve())
    print(f"DAGSTER_HOME={built.home}  runs {built.run_ids}")
