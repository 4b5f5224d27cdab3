"""TensorBoard event files of a run, written by rank 0 beside its checkpoints.

``TensorBoardReporter`` wraps the run's reporter: everything still goes to the inner one (Dagster
Pipes or the log), and the figures also become TensorBoard scalars. Telemetry keys map to tags by
what they measure: ``train/loss``, ``train/lr``, ``train/samples_per_second``, ...; the process and
GPU figures under ``system/`` (``system/gpu_utilization_percent``); per-rank lists one tag per rank
(``per_rank/step_time_s/rank1``); validation metrics under ``validation/<metric>``; detections as
text under ``detections/<detector>``.

The event directory is ``<checkpoint.dir>/../tensorboard`` (``event_dir``), so it lives and dies
with the run's checkpoints and every attempt of a restarted run writes to the same place. The
writer opens at the first figure, after the run restored its checkpoint, with TensorBoard's
``purge_step`` one past the step it resumed from (0 on a fresh start): the points a killed attempt
wrote after that checkpoint are hidden, and the resumed attempt's own points replace them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training_runtime.observe.telemetry import Reporter

EVENT_DIR_NAME = "tensorboard"
# Process and device figures; every other numeric telemetry key is a training figure.
SYSTEM_KEYS = ("cpu_percent", "rss_bytes")
SYSTEM_PREFIX = "gpu_"
PER_RANK_PREFIX = "per_rank_"
VALIDATION_PREFIX = "validation_"
# Telemetry keys that are positions or bookkeeping, not figures to plot.
NOT_FIGURES = frozenset({"kind", "step", "gpu_time_upto_step"})


def event_dir(checkpoint_dir: str | os.PathLike) -> Path:
    """Where a run whose checkpoints are in ``checkpoint_dir`` writes its event files."""
    return Path(os.path.normpath(checkpoint_dir)).parent / EVENT_DIR_NAME


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def telemetry_scalars(payload: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard tags and values of one telemetry payload."""
    out: dict[str, float] = {}
    for key, value in payload.items():
        if key in NOT_FIGURES:
            continue
        if key.startswith(PER_RANK_PREFIX) and isinstance(value, (list, tuple)):
            name = key[len(PER_RANK_PREFIX):]
            out.update({f"per_rank/{name}/rank{i}": float(v) for i, v in enumerate(value) if _is_number(v)})
        elif _is_number(value):
            group = "system" if key in SYSTEM_KEYS or key.startswith(SYSTEM_PREFIX) else "train"
            out[f"{group}/{key}"] = float(value)
    return out


def validation_scalars(payload: dict[str, Any]) -> dict[str, float]:
    """``validation_<metric>`` figures of a validation payload as ``validation/<metric>``."""
    return {f"validation/{k[len(VALIDATION_PREFIX):]}": float(v) for k, v in payload.items()
            if k.startswith(VALIDATION_PREFIX) and _is_number(v)}


def detection_text(payload: dict[str, Any]) -> str:
    """One detection as a Markdown line: severity, where, and the message."""
    where = f" on rank {payload['rank']}" if payload.get("rank") is not None else ""
    return f"**{payload.get('severity', 'warning')}**{where}: {payload.get('message', '')}"


class TensorBoardReporter:
    """A Reporter that forwards everything to ``inner`` and writes the figures to ``logdir``.

    ``resumed_from_step`` is asked once, when the writer opens at the first figure: the step of
    the checkpoint this attempt resumed from, or None on a fresh start. Use it as a context
    manager (or call ``close``) so the last events reach the disk."""

    def __init__(self, inner: Reporter, logdir: str | os.PathLike,
                 resumed_from_step: Callable[[], int | None] = lambda: None):
        # Imported now, during the run's set-up, not at the first figure: the import (0.2 s here,
        # tensorboard and the boto3 its file layer loads) inside the loop stalled one step of
        # every rank, +2.7% on the mean step of a 160-step run (benchmarks/, row 5b). The file
        # itself still opens at the first figure, once the step resumed from is known.
        from torch.utils.tensorboard import SummaryWriter

        self._summary_writer = SummaryWriter
        self.inner = inner
        self.logdir = Path(logdir)
        self.resumed_from_step = resumed_from_step
        self._writer = None
        self._closed = False
        # The hang watchdog reports from its own thread; one writer call at a time.
        self._lock = threading.Lock()

    # ------------------------------------------------------------ Reporter
    def info(self, message: str) -> None:
        self.inner.info(message)

    def custom(self, payload: dict[str, Any]) -> None:
        self.inner.custom(payload)
        with self._lock:
            self._write(payload)

    # ------------------------------------------------------------ writing
    def _write(self, payload: dict[str, Any]) -> None:
        kind, step = payload.get("kind"), payload.get("step")
        if self._closed or not isinstance(step, int) or isinstance(step, bool):
            return  # the run's final figures carry no step: the scalars already hold them
        if kind == "telemetry":
            self._scalars(telemetry_scalars(payload), step)
        elif kind == "validation":
            self._scalars(validation_scalars(payload), step)
        elif kind == "detection":
            self._open().add_text(f"detections/{payload.get('detector', 'unknown')}", detection_text(payload), step)
        else:
            return
        # Each interval reaches the disk before training goes on: a live TensorBoard shows it,
        # and a checkpoint written after it never points past what the event files hold.
        self._writer.flush()

    def _scalars(self, scalars: dict[str, float], step: int) -> None:
        if not scalars:
            return
        writer = self._open()
        for tag, value in scalars.items():  # NaN/inf too: a diverging loss is what the curve should show
            writer.add_scalar(tag, value, step)

    def _open(self):
        if self._writer is None:
            resumed = self.resumed_from_step()
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = self._summary_writer(log_dir=str(self.logdir), purge_step=0 if resumed is None else resumed + 1)
        return self._writer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._writer is not None:
                self._writer.close()

    def __enter__(self) -> TensorBoardReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def tensorboard_reporting(reporter: Reporter, *, enabled: bool, checkpoint_dir: str | os.PathLike,
                          resumed_from_step: Callable[[], int | None]) -> Iterator[Reporter]:
    """The reporter a run uses: with ``enabled`` (rank 0 and ``telemetry.tensorboard`` on),
    ``reporter`` wrapped to also write event files beside the checkpoints; else ``reporter`` as is."""
    if not enabled:
        yield reporter
        return
    with TensorBoardReporter(reporter, event_dir(checkpoint_dir), resumed_from_step=resumed_from_step) as wrapped:
        yield wrapped
