"""A failed training as a UI user meets it: a digits run whose loss turns non-finite at step 2,
launched through the webserver (GraphQL), then its run page opened in Chromium.

What the user must see: the cause, in the training's own words, as the first line of the step's
failure, once there (not again as "caused by: External execution process failed", not repeated
per rank or per attempt), with Dagster's stack trace after it. Filtering the run's log by the
cause finds only the guard's live report at the step it fired. (Dagster's run failure event
repeats its first step's error by design; it is Dagster's summary of the run, not ours.)
Screenshots: ``test-artifacts/ui/failed_run.png`` and ``failed_run_filtered.png``.
"""

from __future__ import annotations

import time

import dagster as dg
import pytest
from playwright.sync_api import expect

from tests.ui.browser import ARTIFACTS, launched_run, new_page, write_home

pytestmark = pytest.mark.slow

STEP = "digits__checkpoint.digits_distributed_training"
CAUSE = "non-finite loss at step 2"
FINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
WAIT_S = 600.0


def _failed_run(instance: dg.DagsterInstance, run_id: str) -> str:
    """Wait for the run to end; the description of its one step failure."""
    deadline = time.monotonic() + WAIT_S
    while instance.get_run_by_id(run_id).status not in FINAL:
        assert time.monotonic() < deadline, f"run {run_id} still {instance.get_run_by_id(run_id).status}"
        time.sleep(1.0)
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
    (failure,) = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records]
    assert failure.step_key == STEP
    return failure.step_failure_data.user_failure_data.description


def _rows(page, event_type: str):
    """The run log's rows of one event type (the log is virtualized: rows off screen are not drawn)."""
    return page.locator("[data-index]").filter(has=page.get_by_text(event_type, exact=True))


def test_a_failed_runs_cause_is_its_first_line_once_in_the_run_page(tmp_path, browser):
    home = write_home(tmp_path, "tests.ui.failing_definitions", "failing")
    with launched_run(home, tmp_path / "workspace.yaml", "failed_run_webserver.log", "digits_training",
                      "failed-run-test") as (url, instance, run_id):
        description = _failed_run(instance, run_id)
        assert description.startswith("training 'digits' failed, not retried") and CAUSE in description

        page = new_page(browser)
        try:
            page.goto(f"{url}/runs/{run_id}")
            # The step panel names the one step that failed.
            expect(page.get_by_text("Errored (1)")).to_be_visible()
            expect(page.get_by_text(STEP, exact=True).first).to_be_visible()

            failure = _rows(page, "STEP_FAILURE")
            expect(failure).to_have_count(1)
            text = failure.inner_text()
            message = text.split("STEP_FAILURE", 1)[1].strip()
            # The cause first, in the training's words; the stack trace after it.
            assert message.splitlines()[0] == f"dagster._core.definitions.events.Failure: {description}", message[:600]
            assert text.count(CAUSE) == 1, text[:2000]
            assert message.index("Stack Trace:") > message.index(CAUSE)
            assert "External execution process failed" not in text and "caused by" not in text.lower()
            failure.scroll_into_view_if_needed()
            page.screenshot(path=ARTIFACTS / "failed_run.png")

            # The run's log filtered by the cause (the filter reads the messages, so the failure
            # events above are not among them): the guard's one report when it fired; no copies
            # from each rank, each attempt or the launcher.
            page.get_by_placeholder("Filter…").fill(CAUSE)
            rows = page.locator("[data-index]")
            expect(rows).to_have_count(1)
            guard = rows.first.inner_text()
            assert _kind(guard) == "ERROR" and "training health: nonfinite at step 2" in guard, guard
            page.screenshot(path=ARTIFACTS / "failed_run_filtered.png")
        finally:
            page.context.close()


def _kind(row_text: str) -> str:
    """A log row's level or event type: the first of its cells that is one."""
    for cell in row_text.split("\n"):
        cell = cell.strip()
        if cell.isupper() and cell.replace("_", "").isalpha():
            return cell
    return "?"
