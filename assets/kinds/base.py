"""What a kind's ``ingest`` returns, in a module of its own: the kinds' modules import it from
here, since importing the ``assets.kinds`` package (which imports each kind in ``data_kind``)
would make a circle (tests/test_layers.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: the image workers import this package, and not pandas with it
    from assets.quality import QualityReport


@dataclass(frozen=True)
class RawData:
    """What ``ingest`` produced: the raw copy to commit and the verdict on the source."""

    path: Path  # the raw copy (Parquet); committed only when report.passed
    rows: int  # samples (images, documents) accepted
    report: QualityReport
    sources: list[dict] = field(default_factory=list)  # one description per source file read
    parts: dict | None = None  # a kind kept in parts: how many were reused and how many made
