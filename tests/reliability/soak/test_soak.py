"""The soak, in make reliability only (marker ``heavy``): the local platform for SOAK_MINUTES
(30), then the Kubernetes path through the pod simulation for SOAK_K8S_MINUTES (a third of it).
Each writes its record into SOAK_REPORT, which tests/reliability/report.py renders as
RELIABILITY.md's soak section, and fails on any invariant's violation."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.reliability.soak.profile import KUBERNETES, LOCAL
from tests.reliability.soak.settings import SoakSettings
from tests.reliability.soak.soak import run_soak

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

SECTIONS = {LOCAL: "local", KUBERNETES: "kubernetes"}


def _save(settings: SoakSettings, launcher: str, record: dict) -> None:
    if settings.report is None:
        return
    settings.report.parent.mkdir(parents=True, exist_ok=True)
    saved = json.loads(settings.report.read_text()) if settings.report.exists() else {}
    saved[SECTIONS[launcher]] = record
    settings.report.write_text(json.dumps(saved, indent=2, sort_keys=True, default=str))


def _keep_logs(settings: SoakSettings, launcher: str, root: Path) -> None:
    """The platform's logs (webserver, daemon: every run's output) beside the report."""
    if settings.report is not None and (root / "logs").is_dir():
        kept = settings.report.parent / f"soak-logs-{SECTIONS[launcher]}"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(root / "logs", kept)
        if (root / "weed" / "weed.log").is_file():
            shutil.copy(root / "weed" / "weed.log", kept / "seaweedfs.log")


@pytest.mark.parametrize("launcher", [LOCAL, KUBERNETES])
def test_soak(ledger, launcher):
    settings = SoakSettings.from_environment()
    # Not under pytest's numbered temporary folders: a later pytest session prunes those, and
    # other sessions start on this machine while a soak runs.
    root = Path(tempfile.mkdtemp(prefix=f"soak-{SECTIONS[launcher]}-"))
    try:
        record = run_soak(settings, root, launcher)
    finally:
        _keep_logs(settings, launcher, root)
        shutil.rmtree(root, ignore_errors=True)
    _save(settings, launcher, record)
    violations = record["violations"]
    injected = sum(c["injected"] for c in record["faults_by_class"].values())
    ledger.record(f"soak: {SECTIONS[launcher]} platform, mixed load and random faults", not violations,
                  not any(v["invariant"] in ("lineage", "weights", "main", "listed", "pipes") for v in violations),
                  f"{record['minutes_of_load']:g} min, {record['runs']['total']} runs, {injected} faults "
                  + (f"(not injected: {', '.join(record['classes_not_injected'])})"
                     if record["classes_not_injected"] else "(every class)") + f", seed {record['seed']}")
    assert not violations, (f"{len(violations)} violation(s); replay with {record['replay']}:\n"
                            + "\n".join(f"- {v['invariant']} at {v['at']:.0f} s: {v['detail']}" for v in violations[:20]))
