"""A training run's TensorBoard event files, copied into the artifact store beside its weights.

The runtime writes them on rank 0 in ``<checkpoint.dir>/../tensorboard`` on the run's work volume
(training_runtime/observe/tensorboard.py); every attempt and retry of the run appends there. The
training op copies the directory to ``models/<model>/checkpoints/<run_id>/tensorboard/`` and hands
the location on with the checkpoint, so the version's lineage record names it and
``python -m pipelines tensorboard <model>`` finds it. Housekeeping treats the keys like the
weights beside them: kept while a registered version's run owns them.
"""

from __future__ import annotations

from pathlib import Path

from resources.artifacts.base import ArtifactStore
from training_runtime.observe.tensorboard import EVENT_DIR_NAME, event_dir

EVENT_FILE_MARKER = "tfevents"  # TensorBoard's event file names: events.out.tfevents.<time>.<host>...


def run_event_dir(resolved_config: dict) -> Path:
    """Where the run wrote its event files: beside the checkpoint directory its config names."""
    try:
        return event_dir(resolved_config["checkpoint"]["dir"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the run's resolved config has no checkpoint.dir ({exc!r}); it cannot say where "
                         "its TensorBoard event files are") from exc


def upload_event_files(artifacts: ArtifactStore, resolved_config: dict, folder: str) -> dict[str, str]:
    """Copy the run's event files under ``<folder>tensorboard/``. Returns the checkpoint facts to
    add, ``tensorboard_path`` (the key prefix) and ``tensorboard_uri``; empty when the run wrote
    none (``telemetry.tensorboard`` off, or a training function that reported no figures)."""
    local = run_event_dir(resolved_config)
    files = sorted(p for p in local.rglob("*") if p.is_file() and EVENT_FILE_MARKER in p.name) \
        if local.is_dir() else []
    if not files:
        return {}
    prefix = f"{folder.rstrip('/')}/{EVENT_DIR_NAME}"
    for path in files:
        artifacts.put_file(path, f"{prefix}/{path.relative_to(local).as_posix()}")
    return {"tensorboard_path": prefix + "/", "tensorboard_uri": artifacts.uri(prefix)}
