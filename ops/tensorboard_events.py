"""A training run's TensorBoard event files, copied into the artifact store beside its weights.

The runtime writes them on rank 0 in ``<checkpoint.dir>/../tensorboard`` on the run's work volume
(training_runtime/observe/tensorboard.py); every attempt and retry of the run appends there. The
training op copies the directory to ``models/<model>/checkpoints/<run_id>/tensorboard/`` while the
run trains (``EventFileSync``, driven by ops/live_tensorboard.py) and once more when it ends
(``upload_event_files``), and hands the location on with the checkpoint, so the version's lineage
record names it and ``python -m pipelines tensorboard <model>`` finds it. Housekeeping treats the
keys like the weights beside them: kept while a registered version's run owns them.

One TensorBoard serves the artifact store's ``models/`` area (``tensorboard_logdir``): ``make ui``
starts it on the local profile, the Helm chart deploys it on Kubernetes. Its run names are the
keys below ``models/`` (``digits/checkpoints/<run_id>/tensorboard``), so a run's view is that
TensorBoard with a run filter (``tensorboard_link``).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, unquote, urlencode, urlparse

from resources.artifacts.base import ArtifactStore
from training_runtime.observe.tensorboard import EVENT_DIR_NAME, event_dir

EVENT_FILE_MARKER = "tfevents"  # TensorBoard's event file names: events.out.tfevents.<time>.<host>...
# The artifact-store area TensorBoard serves; every run folder (models/<model>/checkpoints/<run>/) is in it.
TENSORBOARD_ROOT = "models"
# How much of a growing event file the live copy uploads per second at most (EventFileSync).
LIVE_COPY_BYTES_PER_S = 256 * 1024
# Shown first in a run's view: the curve every training reports (training_runtime/observe/tensorboard.py tags).
PINNED_CARDS = [{"plugin": "scalars", "tag": "train/loss"}]
# The characters a JavaScript regular expression gives a meaning to (TensorBoard's run filter is one).
_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


def run_event_dir(resolved_config: dict) -> Path:
    """Where the run wrote its event files: beside the checkpoint directory its config names."""
    try:
        return event_dir(resolved_config["checkpoint"]["dir"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the run's resolved config has no checkpoint.dir ({exc!r}); it cannot say where "
                         "its TensorBoard event files are") from exc


def event_files(local: Path) -> list[Path]:
    """The event files under ``local`` (none when it does not exist), in name order."""
    return sorted(p for p in local.rglob("*") if p.is_file() and EVENT_FILE_MARKER in p.name) \
        if local.is_dir() else []


def event_prefix(folder: str) -> str:
    """The key prefix of the event files of the run whose artifact folder is ``folder``."""
    return f"{folder.rstrip('/')}/{EVENT_DIR_NAME}"


def upload_event_files(artifacts: ArtifactStore, resolved_config: dict, folder: str) -> dict[str, str]:
    """Copy the run's event files under ``<folder>tensorboard/``. Returns the checkpoint facts to
    add, ``tensorboard_path`` (the key prefix) and ``tensorboard_uri``; empty when the run wrote
    none (``telemetry.tensorboard`` off, or a training function that reported no figures)."""
    local = run_event_dir(resolved_config)
    files = event_files(local)
    if not files:
        return {}
    prefix = event_prefix(folder)
    for path in files:
        artifacts.put_file(path, f"{prefix}/{path.relative_to(local).as_posix()}")
    return {"tensorboard_path": prefix + "/", "tensorboard_uri": artifacts.uri(prefix)}


class EventFileSync:
    """Copies the event files of ``local`` under ``prefix`` as they grow: each ``sync`` uploads the
    files whose size or modification time changed since their last copy.

    A file is copied whole (object stores do not append), so a long run's growing file would cost
    its whole size every interval: a file is copied again only once ``size / bytes_per_s`` seconds
    have passed since its last copy (256 KiB/s: a 1 MB file, some 500 intervals of 8 ranks' figures,
    at most every 4 s; 20 MB every 80 s). ``sync(final=True)`` copies every change at once.

    A copy is made from a snapshot of the file's bytes: rank 0 keeps appending while it trains, and
    an upload must not read a file that grows under it. A snapshot may end inside a record;
    TensorBoard stops there and reads the record once a later copy completes it."""

    def __init__(self, artifacts: ArtifactStore, local: Path, prefix: str, *,
                 bytes_per_s: float = LIVE_COPY_BYTES_PER_S, clock: Callable[[], float] = time.monotonic):
        self.artifacts, self.local, self.prefix = artifacts, Path(local), prefix.rstrip("/")
        self.bytes_per_s, self.clock = bytes_per_s, clock
        self._copied: dict[Path, tuple[int, int, float]] = {}  # file -> (size, mtime_ns, when) of its last copy

    def sync(self, *, final: bool = False) -> int:
        """Upload what changed (and is due, unless ``final``); returns how many files were uploaded."""
        uploaded = 0
        for path in event_files(self.local):
            stat = path.stat()
            last = self._copied.get(path)
            if last is not None and last[:2] == (stat.st_size, stat.st_mtime_ns):
                continue
            if last is not None and not final and self.clock() - last[2] < last[0] / self.bytes_per_s:
                continue  # changed, but copied too recently for its size
            data = path.read_bytes()
            with tempfile.TemporaryDirectory(prefix="tensorboard-sync-") as tmp:
                snapshot = Path(tmp) / path.name
                snapshot.write_bytes(data)
                self.artifacts.put_file(snapshot, f"{self.prefix}/{path.relative_to(self.local).as_posix()}")
            # What was copied: a file that grew while being read differs from this and goes again.
            self._copied[path] = (len(data), stat.st_mtime_ns if len(data) == stat.st_size else -1, self.clock())
            uploaded += 1
        return uploaded


def tensorboard_logdir(artifacts: ArtifactStore) -> str:
    """TensorBoard's ``--logdir`` for the artifact store: a directory of the local store, or the
    ``s3://`` URI of the S3 one (TensorBoard reads S3 through boto3, without TensorFlow)."""
    uri = artifacts.uri(TENSORBOARD_ROOT)
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "s3":
        return uri
    raise ValueError(f"TensorBoard cannot read the artifact store at {uri}: only local folders and s3:// are served")


def run_filter(folder: str) -> str:
    """TensorBoard's run filter (a regular expression over run names) for the runs under the
    artifact folder ``folder``: the one training of a run, or each trial of its sweep."""
    root = TENSORBOARD_ROOT + "/"
    if not folder.startswith(root):
        raise ValueError(f"{folder!r} is not under {root}: TensorBoard serves only the artifact store's {root} area")
    relative = folder[len(root):].rstrip("/") + "/"
    return "^" + _REGEX_SPECIAL.sub(r"\\\1", relative)


def tensorboard_link(base_url: str, folder: str) -> str:
    """The address of TensorBoard's time series of the runs under ``folder`` only, the training
    loss pinned at the top (the other figures follow in groups). TensorBoard 2.21 reads the run
    filter (``runFilter``) and the pinned cards (``pinnedCards``, JSON) from the query; the
    dashboard is the fragment."""
    query = {"runFilter": run_filter(folder), "pinnedCards": json.dumps(PINNED_CARDS, separators=(",", ":"))}
    return f"{base_url.rstrip('/')}/?{urlencode(query, quote_via=quote, safe='')}#timeseries"
