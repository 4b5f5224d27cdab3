"""Rank 0's Pipes custom messages, shown while the training runs instead of only once it ends.

Both launchers read rank 0's messages with a reader built from ``ForwardsTrainingMessages``: every
message still goes to the Pipes session's own handler (so ``get_custom_messages()`` keeps the full
list), and each custom message is also handed, as it arrives, to ``LiveTrainingMessages``:

- a "telemetry" message becomes an ``AssetObservation`` of the asset being materialized. Dagster
  1.13 charts the numeric (int and float) metadata of an unpartitioned asset's last 100
  materializations and observations on its Overview page (Metadata, "Plots"), one point per event
  at its timestamp, so each figure draws a curve that grows during the run (every message of a
  short training; a long one's thinned, resources/launch/observation_thinning.py);
- a "detection" message (a guard of the runtime fired) becomes a warning or error in the run's log.

The reader thread calls these; a Pipes handler already logs from that thread (``pipes.log``), and
``log_event`` writes the observation to the event log at once.
"""

from __future__ import annotations

import math
import statistics
import traceback
from contextlib import contextmanager
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping

import dagster as dg
from dagster_pipes import PIPES_PROTOCOL_VERSION, PIPES_PROTOCOL_VERSION_FIELD

from resources.launch.observation_thinning import ObservationThinning
from resources.launch.pipes_reader import CompleteLineTempFileMessageReader

# Per-rank lists are summarised: the chart needs one number per figure and event, and the spread
# across ranks (slowest over median) is what shows a straggler or a starved loader.
PER_RANK_PREFIX = "per_rank_"
# Whole numbers (with the ``*_bytes`` counts that arrive as ints); every other figure is charted as a float.
INT_FIGURES = ("step", "epoch", "rss_bytes", "gpu_time_upto_step")
# Carried from the last "validation" message into later observations, so a validation figure is a
# line (the latest value known at each point) and the training figures' lines are not cut by
# events that lack them (the UI leaves a gap wherever an event has no value for a figure).
VALIDATION_PREFIX = "validation_"


def _number(value: Any) -> float | int | None:
    """A finite int or float (not a bool), else None. A non-finite loss is not charted (the chart
    cannot place it); the runtime's nonfinite guard reports it as a detection."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _metadata_number(name: str, value: float | int) -> dg.MetadataValue:
    if name in INT_FIGURES or (isinstance(value, int) and name.endswith("_bytes")):
        return dg.MetadataValue.int(int(value))
    return dg.MetadataValue.float(float(value))


def per_rank_summary(name: str, values: Any) -> dict[str, dg.MetadataValue]:
    """``<name>_max``, ``<name>_min`` and ``<name>_max_over_median`` of a per-rank list; empty when
    the list holds anything but finite numbers."""
    if not isinstance(values, (list, tuple)) or not values:
        return {}
    numbers = [_number(v) for v in values]
    if any(n is None for n in numbers):
        return {}
    top, median = max(numbers), statistics.median(numbers)
    summary = {f"{name}_max": dg.MetadataValue.float(float(top)),
               f"{name}_min": dg.MetadataValue.float(float(min(numbers)))}
    if median > 0:
        summary[f"{name}_max_over_median"] = dg.MetadataValue.float(top / median)
    return summary


def telemetry_metadata(payload: Mapping[str, Any],
                       validation: Mapping[str, Any] | None = None) -> dict[str, dg.MetadataValue]:
    """The metadata of one telemetry message's observation: its numbers as they are, its per-rank
    lists summarised, and the figures of the last validation (``validation``, a "validation"
    message) with the step they were measured at as ``validation_step``."""
    meta: dict[str, dg.MetadataValue] = {}
    for name, value in payload.items():
        if name == "kind":
            continue
        if name.startswith(PER_RANK_PREFIX):
            meta.update(per_rank_summary(name, value))
            continue
        number = _number(value)
        if number is not None:
            meta[name] = _metadata_number(name, number)
    if validation:
        for name, value in validation.items():
            number = _number(value)
            if name.startswith(VALIDATION_PREFIX) and number is not None:
                meta[name] = dg.MetadataValue.float(float(number))
        step = _number(validation.get("step"))
        if step is not None:
            meta["validation_step"] = dg.MetadataValue.int(int(step))
    return meta


def detection_log_line(payload: Mapping[str, Any]) -> tuple[str, str]:
    """(log level, message) of one detection message: the detector, where it fired and its text."""
    level = "error" if payload.get("severity") == "error" else "warning"
    where = [f"step {payload.get('step')}"]
    if payload.get("rank") is not None:
        where.append(f"rank {payload['rank']}")
    where += [str(payload[k]) for k in ("host", "gpu") if payload.get(k)]
    detector = payload.get("detector", "unknown")
    return level, f"training health: {detector} at {', '.join(where)}: {payload.get('message', '')}"


def observed_asset_key(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> dg.AssetKey | None:
    """The one asset the op materializes (the checkpoint, for the training op), else None."""
    if not context.has_assets_def or len(context.assets_def.keys) != 1:
        return None
    return context.assets_def.key


class LiveTrainingMessages:
    """What happens to each custom message of a training while it runs (see the module's text)."""

    def __init__(self, context: dg.OpExecutionContext | dg.AssetExecutionContext):
        self.context = context
        self.last_validation: dict[str, Any] | None = None
        # A long training's telemetry is thinned (resources/launch/observation_thinning.py); the
        # latest message thinning skipped is observed when the session closes, so the chart ends
        # at the training's last figures.
        self.thinning = ObservationThinning()
        self.skipped: tuple[dict[str, Any], dict[str, Any] | None] | None = None

    @cached_property
    def asset_key(self) -> dg.AssetKey | None:
        """Asked at the first telemetry message, not when the launcher builds its reader."""
        return observed_asset_key(self.context)

    def __call__(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            return
        kind = payload.get("kind")
        if kind == "validation":
            self.last_validation = payload
        elif kind == "telemetry" and self.asset_key is not None:
            if self.thinning.keep():
                self.skipped = None
                self._observe(payload, self.last_validation)
            else:
                self.skipped = (payload, self.last_validation)
        elif kind == "detection":
            level, line = detection_log_line(payload)
            self.context.log.log(level, line)

    def _observe(self, payload: dict[str, Any], validation: dict[str, Any] | None) -> None:
        self.context.log_event(dg.AssetObservation(
            asset_key=self.asset_key, description=f"training telemetry at step {payload.get('step')}",
            metadata=telemetry_metadata(payload, validation)))

    def flush(self) -> None:
        """Observe the last telemetry message if thinning skipped it."""
        if self.skipped is not None:
            payload, validation = self.skipped
            self.skipped = None
            self._observe(payload, validation)


class ForwardingMessageHandler:
    """Stands in for a Pipes session's ``PipesMessageHandler`` inside its message reader (as Dagster's
    own ``_ChildMessageHandler`` does for composite readers): each message goes to the real handler
    first, then each custom message's payload to ``on_custom``. Anything else a reader asks of a
    handler is the real handler's."""

    def __init__(self, handler: Any, on_custom: Callable[[Any], None]):
        self._handler = handler
        self._on_custom = on_custom

    def handle_message(self, message: Mapping[str, Any]) -> None:
        self._handler.handle_message(message)
        if message.get("method") != "report_custom_message":
            return
        try:
            self._on_custom((message.get("params") or {}).get("payload"))
        except Exception:  # noqa: BLE001
            # The reader thread must live on: an exception here would end it, and with it every
            # later message of the run (its final figures and the "closed" message included).
            self._handler._context.log.warning(  # noqa: SLF001 (Dagster's readers log through it too)
                "could not show a training message live:\n" + traceback.format_exc())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)


class ForwardsTrainingMessages:
    """Mixin for a ``PipesMessageReader``: custom messages also reach ``LiveTrainingMessages`` of
    ``context`` while the session runs. Put it before the reader class in the bases."""

    def __init__(self, *args: Any, context: dg.OpExecutionContext | dg.AssetExecutionContext, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.live = LiveTrainingMessages(context)

    @contextmanager
    def read_messages(self, handler: Any) -> Iterator[Any]:
        try:
            with super().read_messages(ForwardingMessageHandler(handler, self.live)) as params:  # type: ignore[misc]
                yield params
        finally:
            close_left_open(handler)
        # After the reader has delivered every message (a failed session raises before this: its
        # figures up to the last observed one are what there is to see).
        self.live.flush()


CLOSED_FOR_THE_TRAINING = ("[pipes] the training ended with its Pipes session open: its last attempt failed in a "
                           "way a new attempt may fix (or was killed) and no attempt followed in this launch; "
                           "every message it wrote was read, and the launcher closes the session")


def close_left_open(handler: Any) -> None:
    """Close a session the training opened and left open. Rank 0 leaves it open after a failure
    a new attempt may fix, since torchrun, an elastic gang or the Job controller may start one in
    this same session (training_runtime/observe/pipes.py); once the reader has read the launch to
    its end, none will. Without this Dagster warns that "buffered messages may have been
    discarded", which the launchers' channels (a file appended to per message, a pod's log) never
    do; the step still fails, with the training's own account of why (the attempt records)."""
    if handler.received_opened_message and not handler.received_closed_message:
        handler._context.log.info(CLOSED_FOR_THE_TRAINING)  # noqa: SLF001 (Dagster's readers log through it too)
        handler.handle_message({PIPES_PROTOCOL_VERSION_FIELD: PIPES_PROTOCOL_VERSION, "method": "closed",
                                "params": {}})


class LiveTempFileMessageReader(ForwardsTrainingMessages, CompleteLineTempFileMessageReader):
    """``PipesSubprocessClient``'s default reader (a file it tails, by whole lines only:
    resources/launch/pipes_reader.py), forwarding live."""
