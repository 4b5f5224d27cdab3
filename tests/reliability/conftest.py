"""The reliability suite records, per class of test, how many cases were tried, how many were
survived or refused correctly, and whether the nothing-lost check held. `make reliability` runs
it in full (RELIABILITY_FULL=1) and writes RELIABILITY.md; `make test` runs a small sample.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

FULL = os.environ.get("RELIABILITY_FULL") == "1"
REPORT = os.environ.get("RELIABILITY_REPORT")  # where to write the ledger as JSON


def repeats(full: int, sample: int = 1) -> int:
    return full if FULL else sample


class Ledger:
    def __init__(self):
        self.rows: dict[str, dict] = defaultdict(lambda: {"tried": 0, "ok": 0, "nothing_lost": 0, "notes": set()})

    def record(self, cls: str, ok: bool, nothing_lost: bool, note: str = "") -> None:
        row = self.rows[cls]
        row["tried"] += 1
        row["ok"] += int(ok)
        row["nothing_lost"] += int(nothing_lost)
        if note:
            row["notes"].add(note)


_LEDGER = Ledger()


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    return _LEDGER


def pytest_sessionfinish(session, exitstatus):
    if REPORT and _LEDGER.rows:
        out = {k: {**v, "notes": sorted(v["notes"])} for k, v in sorted(_LEDGER.rows.items())}
        Path(REPORT).write_text(json.dumps({"full": FULL, "classes": out}, indent=2))
