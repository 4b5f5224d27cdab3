"""A platform where a model's versions have TensorBoard event files in the artifact store, laid
out as the training op leaves them, without a Dagster run: events written by the runtime's
reporter, copied by the op's ``upload_event_files``, named by each version's lineage record."""

from __future__ import annotations

import json
from pathlib import Path

from core.registry import lineage_path, version_tag
from ops.tensorboard_events import upload_event_files
from pipelines.profiles import Profile
from resources.store.base import MAIN
from tests.cli.records import make_record
from training_runtime.observe.tensorboard import TensorBoardReporter


class _Quiet:
    def info(self, message):
        pass

    def custom(self, payload):
        pass


def write_run_events(work_dir: Path, losses: list[float], every: int = 2) -> Path:
    """A run's event files beside its checkpoint dir, as rank 0 writes them; returns the checkpoint dir."""
    checkpoints = work_dir / "checkpoints"
    with TensorBoardReporter(_Quiet(), work_dir / "tensorboard") as reporter:
        for i, loss in enumerate(losses, start=1):
            reporter.custom({"kind": "telemetry", "step": i * every, "loss": loss, "lr": 0.01,
                             "per_rank_step_time_s": [0.1, 0.2]})
    return checkpoints


def register_versions(home: Path, model: str, checkpoint_dirs: dict[int, Path | None]) -> Profile:
    """Versions 1..N of ``model`` in the local platform at DAGSTER_HOME ``home``; version v's events
    are those beside ``checkpoint_dirs[v]`` (None: a version registered without any)."""
    profile = Profile(name="local", data_root=home / "platform")
    resources = profile.resources()
    store, artifacts = resources["store"].get(), resources["artifacts"].get()
    store.ensure_repository()
    for version, checkpoint_dir in sorted(checkpoint_dirs.items()):
        folder = f"models/{model}/checkpoints/run-{version}/"
        events = upload_event_files(artifacts, {"checkpoint": {"dir": str(checkpoint_dir)}}, folder) \
            if checkpoint_dir is not None else {}
        record = make_record(version, model=model, **{f"checkpoint.{k}": v for k, v in events.items()})
        store.put_object(MAIN, lineage_path(model, version), json.dumps(record).encode())
        commit = store.commit(MAIN, f"Register {model} v{version}", {})
        store.create_tag(version_tag(model, version), commit.id)
    return profile
