"""Which telemetry messages of one training become observations of its checkpoint asset.

Rank 0 reports telemetry every ``telemetry.every_steps`` (10 by default), so a 10,000-step training
sends 1,000 messages. As one observation each, they would be 1,000 events of about 5 kB in the
run's event log (the Run page loads all of them) and on the asset, while the UI's Plots chart only
the asset's last 100 events: the last tenth of that one run. Thinned, every message of a short
training is still an observation, and a long one leaves a number that grows with the logarithm of
its length, spread over the whole run (TensorBoard keeps every point: docs/experiments.md).
"""

from __future__ import annotations

# A training with at most this many telemetry messages has each of them as an observation.
OBSERVED_IN_FULL = 50


class ObservationThinning:
    """All of the first ``in_full`` messages, then every 2nd until ``in_full // 2`` more were kept,
    then every 4th for as many, every 8th, ...: of n messages about
    ``in_full + in_full / 2 * log2(n / in_full)`` are kept (157 of 1,000 and 240 of 10,000 with 50),
    and the kept ones are spaced evenly within each stretch."""

    def __init__(self, in_full: int = OBSERVED_IN_FULL):
        if in_full < 2:
            raise ValueError(f"in_full must be at least 2 (half of it is kept per doubling), got {in_full}")
        self.in_full = in_full
        self.seen = 0
        self.kept = 0
        self.stride = 1

    def keep(self) -> bool:
        """Whether the next message becomes an observation; call once per message, in order."""
        due = self.seen % self.stride == 0
        self.seen += 1
        if not due:
            return False
        self.kept += 1
        if self.kept >= self.in_full and (self.kept - self.in_full) % (self.in_full // 2) == 0:
            self.stride *= 2
        return True
