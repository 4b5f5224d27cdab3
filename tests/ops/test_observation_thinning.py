"""A long training's telemetry becomes a bounded number of observations, spread over the run, and
its last figures are always observed (resources/launch/observation_thinning.py, live_telemetry.py)."""

from __future__ import annotations

import dagster as dg
import pytest

from resources.launch.live_telemetry import LiveTrainingMessages
from resources.launch.observation_thinning import OBSERVED_IN_FULL, ObservationThinning


def _kept(n: int, in_full: int = OBSERVED_IN_FULL) -> list[int]:
    thinning = ObservationThinning(in_full)
    return [i for i in range(n) if thinning.keep()]


def test_a_short_training_is_observed_in_full():
    assert _kept(OBSERVED_IN_FULL) == list(range(OBSERVED_IN_FULL))


@pytest.mark.parametrize(("messages", "observations"), [(100, 75), (1_000, 157), (10_000, 240)])
def test_a_long_training_leaves_logarithmically_many_observations(messages, observations):
    assert len(_kept(messages)) == observations


def test_the_kept_messages_span_the_run_with_a_stride_that_doubles():
    kept = _kept(1_000)
    gaps = [b - a for a, b in zip(kept, kept[1:])]
    assert set(gaps) == {1, 2, 4, 8, 16, 32}
    assert gaps == sorted(gaps)  # never denser later than earlier
    assert kept[-1] >= 1_000 - 32  # the last stride's worth of the run at most is not charted yet


def test_in_full_must_leave_something_to_halve():
    with pytest.raises(ValueError, match="in_full must be at least 2"):
        ObservationThinning(1)


class _Context:
    """The parts of an asset's execution context LiveTrainingMessages uses."""

    has_assets_def = True

    def __init__(self):
        self.events: list[dg.AssetObservation] = []
        self.assets_def = type("AssetsDef", (), {"keys": {dg.AssetKey(["m", "checkpoint"])},
                                                 "key": dg.AssetKey(["m", "checkpoint"])})()

    def log_event(self, event) -> None:
        self.events.append(event)


def test_the_last_telemetry_is_observed_when_the_session_closes():
    context = _Context()
    live = LiveTrainingMessages(context)
    for step in range(10, 10 * 200 + 1, 10):
        live({"kind": "telemetry", "step": step, "loss": 1.0 / step})
    observed = [e.metadata["step"].value for e in context.events]
    assert len(observed) == len(_kept(200)) and observed[-1] < 2000
    live.flush()
    assert context.events[-1].metadata["step"].value == 2000
    live.flush()  # nothing more to flush
    assert [e.metadata["step"].value for e in context.events][-2:] == [observed[-1], 2000]
