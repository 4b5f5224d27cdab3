"""The soak's settings, from the environment (``make reliability`` passes the defaults):

- ``SOAK_MINUTES`` (30): how long load and faults run on the local platform, before the drain;
- ``SOAK_K8S_MINUTES`` (a third of it): the same on the Kubernetes path (the pod simulation);
- ``SOAK_SEED`` (drawn at random, and recorded): replays the faults' classes, gaps and settings;
- ``SOAK_REPORT``: where the soak's JSON goes (test-artifacts/soak.json in ``make reliability``).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


@dataclass(frozen=True)
class SoakSettings:
    minutes: float = 30.0
    k8s_minutes: float = 10.0
    seed: int = 0
    report: Path | None = None
    fault_gap_s: tuple[float, float] = (15.0, 40.0)  # between the end of one fault and the next (30 min)
    commit_every_s: tuple[float, float] = (45.0, 90.0)  # between new-data commits of digits
    check_every_s: float = 60.0  # invariant rounds
    sample_every_s: float = 30.0  # footprint samples
    drain_timeout_s: float = 900.0  # for the runs in flight when load and faults stop

    def gap_for(self, minutes: float) -> tuple[float, float]:
        """The gap between faults in a soak of ``minutes``: ``fault_gap_s`` at 30 minutes and
        more, shorter in proportion below (down to a fifth), so that a shorter soak still draws
        every class: one round of the local classes takes about 5 minutes of faults themselves
        (a hung rank alone takes 1-2 minutes to be found and ended) plus the gaps."""
        scale = min(1.0, max(0.2, minutes / 30.0))
        return (round(self.fault_gap_s[0] * scale, 2), round(self.fault_gap_s[1] * scale, 2))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "SoakSettings":
        env = os.environ if environ is None else environ
        try:
            minutes = float(env.get("SOAK_MINUTES") or 30)
            k8s = float(env["SOAK_K8S_MINUTES"]) if env.get("SOAK_K8S_MINUTES") else minutes / 3
            seed = int(env["SOAK_SEED"]) if env.get("SOAK_SEED") else random.SystemRandom().randrange(2**31)
        except ValueError as exc:
            raise ValueError(f"SOAK_MINUTES and SOAK_K8S_MINUTES must be numbers of minutes and SOAK_SEED an "
                             f"integer: {exc}") from exc
        if minutes <= 0 or k8s <= 0:
            raise ValueError(f"SOAK_MINUTES ({minutes}) and SOAK_K8S_MINUTES ({k8s}) must be positive")
        return cls(minutes=minutes, k8s_minutes=k8s, seed=seed,
                   report=Path(env["SOAK_REPORT"]) if env.get("SOAK_REPORT") else None)
