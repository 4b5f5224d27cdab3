"""The new-data sensor under a burst of commits: it never launches overlapping retrains of the same
model and never skips the newest commit."""

from __future__ import annotations

import random

import dagster as dg
import pytest

from assets.pipeline import SOURCE_COMMIT_TAG
from pipelines.models.digits import digits_frame
from tests.automation.test_triggers import SPEC, _running_run, _tick, _upload
from tests.pipeline.conftest import Platform
from tests.reliability.conftest import repeats


@pytest.fixture
def platform(tmp_path):
    p = Platform(tmp_path)
    yield p
    p.instance.dispose()


def test_burst_of_new_data_commits(platform, ledger):
    from pipelines.definitions import build_definitions

    defs = build_definitions(platform.profile, [SPEC], with_yaml=False)
    store = platform.store()
    store.ensure_repository()
    rng = random.Random(11)
    frame = digits_frame().head(40)
    n_commits = repeats(100, 25)
    cursor = _tick(defs, platform, None).cursor
    in_flight: list[tuple[dg.DagsterRun, int]] = []  # (run, ticks left until it finishes)
    overlaps = 0
    launched_on: list[str] = []
    head = None
    for i in range(n_commits):
        head = _upload(store, f"sources/digits/burst-{i:03d}.csv", frame, f"burst {i}")
        if rng.random() < 0.5:
            continue  # several commits land between two ticks
        tick = _tick(defs, platform, cursor)
        cursor = tick.cursor or cursor
        for request in tick.run_requests:
            overlaps += int(bool(in_flight))
            launched_on.append(request.tags[SOURCE_COMMIT_TAG])
            in_flight.append((_running_run(platform.instance, "digits"), rng.randint(1, 4)))
        still = []
        for run, left in in_flight:
            if left <= 1:
                platform.instance.report_run_canceled(run)  # the retrain ended
            else:
                still.append((run, left - 1))
        in_flight = still
    for run, _ in in_flight:  # the burst is over: let the last retrain finish, then tick once more
        platform.instance.report_run_canceled(run)
    final = _tick(defs, platform, cursor)
    launched_on.extend(r.tags[SOURCE_COMMIT_TAG] for r in final.run_requests)
    newest_trained = bool(launched_on) and launched_on[-1] == head
    ok = overlaps == 0 and newest_trained
    ledger.record("load: burst of new-data commits", ok, newest_trained,
                  f"{n_commits} commits, {len(launched_on)} retrains launched, {overlaps} overlapping")
    assert overlaps == 0
    assert newest_trained, (launched_on[-3:], head)
