"""The soak's settings, from the environment (``make reliability`` passes the defaults):

- ``SOAK_MINUTES`` (30): how long load and faults run on the local platform, before the drain;
- ``SOAK_K8S_MINUTES`` (a third of it): the same on the Kubernetes path (the pod simulation);
- ``SOAK_SEED`` (drawn at random, and recorded): replays the faults' classes, gaps and settings;
- ``SOAK_REPORT``: where the soak's JSON goes (test-artifacts/soak.json in ``make reliability``);
- ``SOAK_CLASSES`` (every class): a comma-separated list of fault classes to draw from alone, e.g.
  ``elastic_node_lost,elastic_node_rejoin`` to soak the elastic gang's classes in a short run
  (each launcher draws those of the list it has; faults.py names them).
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
    classes: tuple[str, ...] | None = None  # SOAK_CLASSES; None: every class of the launcher

    def classes_for(self, known: Mapping[str, str]) -> dict[str, str]:
        """The classes (name -> label) a launcher whose classes are ``known`` draws from."""
        if self.classes is None:
            return dict(known)
        chosen = {c: label for c, label in known.items() if c in self.classes}
        if not chosen:
            raise ValueError(f"SOAK_CLASSES ({', '.join(self.classes)}) names none of this launcher's classes "
                             f"({', '.join(sorted(known))}); name some of them, or run only the other launcher's "
                             "soak (pytest -k kubernetes or -k local)")
        return chosen

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
        classes = tuple(c.strip() for c in env.get("SOAK_CLASSES", "").split(",") if c.strip()) or None
        if classes is not None:
            from tests.reliability.soak.faults import KUBERNETES_CLASSES  # every class is a Kubernetes one

            unknown = [c for c in classes if c not in KUBERNETES_CLASSES]
            if unknown:
                raise ValueError(f"SOAK_CLASSES names unknown fault classes {', '.join(unknown)}; the classes are "
                                 f"{', '.join(sorted(KUBERNETES_CLASSES))}")
        return cls(minutes=minutes, k8s_minutes=k8s, seed=seed, classes=classes,
                   report=Path(env["SOAK_REPORT"]) if env.get("SOAK_REPORT") else None)
