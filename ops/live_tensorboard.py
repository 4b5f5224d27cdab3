"""A training's curves in TensorBoard while it trains, and the link to them in the run.

Rank 0 writes its event files on the run's work volume (training_runtime/observe/tensorboard.py).
While a training launched by the training op runs, a thread of the op copies the changed ones to
the run's artifact folder every ``LIVE_SYNC_INTERVAL_S``, a large file less often
(ops/tensorboard_events.EventFileSync, at most ``LIVE_COPY_BYTES_PER_S``). The platform's
TensorBoard reads them there as they grow (``make ui`` on the local profile, the chart's on
Kubernetes, both over the artifact store's ``models/`` area). The step pod of a
Kubernetes run mounts the same shared volume as the training pods, so this works there too.

When the first event files reach the store (the first telemetry interval of the run), the run's
log says where to watch, and an observation of the checkpoint asset carries the link as a url
value (``tensorboard``); the materialization repeats it. The link filters TensorBoard to this run
(every trial of its sweep included). Without a TensorBoard URL (``PlatformSettings.tensorboard_url``)
the log names the event files' location and how to serve them instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from ops.tensorboard_events import EventFileSync, event_prefix, tensorboard_link
from resources.artifacts.base import ArtifactStore
from resources.launch.live_telemetry import observed_asset_key
from training_runtime.observe.tensorboard import event_dir

# How often a training's event files are copied: about as often as TensorBoard reloads them (5 s).
LIVE_SYNC_INTERVAL_S = 3.0
LINK_KEY = "tensorboard"


class LiveTensorBoard:
    """The live TensorBoard view of one Dagster run of the training op.

    ``folder``: the run's artifact folder (``models/<model>/checkpoints/<run_id>/``); ``run_dir``:
    its work directory, below which each training (the run's, or each trial's) has its own."""

    def __init__(self, context: dg.OpExecutionContext, artifacts: ArtifactStore, *, folder: str, run_dir: Path,
                 tensorboard_url: str | None, interval_s: float = LIVE_SYNC_INTERVAL_S):
        self.context, self.artifacts, self.folder = context, artifacts, folder
        self.run_dir, self.interval_s = Path(run_dir), interval_s
        self.link = tensorboard_link(tensorboard_url, folder) if tensorboard_url else None
        self._announced = False
        self._last_error: str | None = None  # each distinct copy failure is logged once, not every interval
        self._lock = threading.Lock()

    def metadata(self) -> dict[str, dg.MetadataValue]:
        """The link, for the materialization: present once the run's event files reached the store."""
        return {LINK_KEY: dg.MetadataValue.url(self.link)} if self.link and self._announced else {}

    @contextmanager
    def watching(self, work_dir: Path) -> Iterator[None]:
        """Copy the event files of the training in ``work_dir`` while the block runs, and once
        more as it ends (a failed training's curves included)."""
        relative = Path(work_dir).relative_to(self.run_dir).as_posix()
        prefix = event_prefix(self.folder + ("" if relative == "." else relative + "/"))
        # The training's checkpoint dir is <work_dir>/checkpoints (ops/training.run_distributed_training).
        sync = EventFileSync(self.artifacts, event_dir(Path(work_dir) / "checkpoints"), prefix)
        stop = threading.Event()
        thread = threading.Thread(target=self._follow, args=(sync, stop), daemon=True,
                                  name=f"tensorboard-sync:{prefix}")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self._sync(sync, final=True)

    def _follow(self, sync: EventFileSync, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            self._sync(sync)

    def _sync(self, sync: EventFileSync, final: bool = False) -> None:
        try:
            copied = sync.sync(final=final)
        except Exception as exc:  # noqa: BLE001
            # The training goes on without live curves; the op's final upload reports a lasting failure.
            error = f"{type(exc).__name__}: {exc}"
            if error != self._last_error:
                self._last_error = error
                self.context.log.warning(f"could not copy this run's TensorBoard event files to {sync.prefix}/ "
                                         f"({error}); TensorBoard shows them once a later copy succeeds")
            return
        self._last_error = None
        if copied:
            self._announce(sync.prefix)

    def _announce(self, prefix: str) -> None:
        with self._lock:
            if self._announced:
                return
            self._announced = True
        if self.link is None:
            self.context.log.info(
                f"this run's TensorBoard event files are copied to {self.artifacts.uri(prefix)} as it trains; no "
                "TensorBoard is configured to show them (`make ui` starts one and sets TENSORBOARD_URL; "
                "set it to the address of your own)")
            return
        self.context.log.info(f"TensorBoard of this run, live while it trains: {self.link}")
        key = observed_asset_key(self.context)
        if key is not None:
            self.context.log_event(dg.AssetObservation(
                asset_key=key, description="TensorBoard of this run: its curves against the step, live",
                metadata={LINK_KEY: dg.MetadataValue.url(self.link)}))
