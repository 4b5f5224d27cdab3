"""A training watched live in the Dagster UI: while one run of digits trains, the checkpoint asset's
metadata plots are opened twice, and the second time they chart more of the run.

The run is launched through the webserver (GraphQL), as a user would from the UI. Each time, the
test reads what the Plots view charted from the GraphQL answer it loaded (the asset's last 100
events, observations included) and takes a screenshot: ``test-artifacts/ui/live_plots_1.png`` and
``live_plots_2.png``; README shows the second (docs/images/live_plots.png).
"""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import Page, expect

from tests.ui.browser import ARTIFACTS, launched_run, new_page, write_home

pytestmark = pytest.mark.slow

CHECKPOINT = dg.AssetKey(["digits", "checkpoint"])
FIRST_POINTS = 3  # observations in the event log before the plots are first opened
MORE_POINTS = 6  # ...and how many more before they are opened again
WAIT_S = 600.0  # ingest and sharding come first; two busy cores are slow
FINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


@pytest.fixture
def home(tmp_path) -> Path:
    return write_home(tmp_path, "tests.ui.live_definitions", "live")


def _observations(instance: dg.DagsterInstance, run_id: str) -> int:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    return sum(1 for r in records if r.event_log_entry.dagster_event.asset_key == CHECKPOINT)


def _wait_for_observations(instance: dg.DagsterInstance, run_id: str, count: int) -> int:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        seen = _observations(instance, run_id)
        if seen >= count:
            return seen
        run = instance.get_run_by_id(run_id)
        assert run.status not in FINAL, f"run {run_id} ended {run.status} with {seen} observation(s)"
        time.sleep(1.0)
    raise TimeoutError(f"run {run_id}: fewer than {count} observations of {CHECKPOINT.to_user_string()} "
                       f"after {WAIT_S:.0f} s")


def _charted_steps(page: Page, url: str) -> list[int]:
    """Open the checkpoint's Plots; the training steps of the observations they chart."""
    page.goto(url)
    expect(page.get_by_role("button", name="Plots")).to_be_visible()
    with page.expect_response(lambda r: "graphql" in r.url and "RecentAssetEventsQuery" in (r.request.post_data or "")
                              and '"limit":100' in (r.request.post_data or "").replace(" ", "")) as answer:
        page.get_by_role("button", name="Plots").click()
    events = answer.value.json()["data"]["assetOrError"]["assetEventHistory"]["results"]
    steps = [entry["intValue"] for event in events if event["__typename"] == "ObservationEvent"
             for entry in event["metadataEntries"] if entry["label"] == "step"]
    # The charts are drawn (canvas) under their figures' names.
    for figure in ("loss", "samples_per_second"):
        expect(page.get_by_text(figure, exact=True).first).to_be_visible()
    expect(page.locator("canvas").first).to_be_visible()
    # The loss chart at the top of the screenshot: the figures are charted in alphabetical order.
    page.get_by_text("loss", exact=True).first.evaluate("heading => heading.scrollIntoView({block: 'start'})")
    return sorted(steps)


def test_the_checkpoint_plots_grow_while_the_training_runs(home, tmp_path, browser):
    with launched_run(home, tmp_path / "workspace.yaml", "live_webserver.log", "digits_training",
                      "live-plots-test") as (url, instance, run_id):
        page = new_page(browser, 1400, 1000)
        try:
            plots = f"{url}/assets/{'/'.join(CHECKPOINT.path)}"

            _wait_for_observations(instance, run_id, FIRST_POINTS)
            first = _charted_steps(page, plots)
            page.screenshot(path=ARTIFACTS / "live_plots_1.png")
            assert instance.get_run_by_id(run_id).status not in FINAL  # taken while the run trains

            _wait_for_observations(instance, run_id, len(first) + MORE_POINTS)
            second = _charted_steps(page, plots)
            page.screenshot(path=ARTIFACTS / "live_plots_2.png")
            assert instance.get_run_by_id(run_id).status not in FINAL
        finally:
            page.context.close()
        assert len(first) >= FIRST_POINTS, first
        # The second view charts points the first could not: the curve grew (the view holds the
        # last 100 events, so once past that its count stays, but its newest step still moves on).
        assert max(second) > max(first) and len(second) >= min(len(first) + MORE_POINTS, 100), (first, second)

        deadline = time.monotonic() + WAIT_S
        while instance.get_run_by_id(run_id).status not in FINAL and time.monotonic() < deadline:
            time.sleep(2.0)
        run = instance.get_run_by_id(run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS, run.status
        checks = [r.event_log_entry.dagster_event.asset_check_evaluation_data for r in instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records]
        assert [(c.asset_key, c.check_name) for c in checks if c.check_name == "training_health"] == [
            (CHECKPOINT, "training_health")]
