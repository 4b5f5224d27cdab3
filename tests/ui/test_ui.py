"""What an ML engineer sees in the Dagster UI, in a real headless Chromium, and a run launched
through the webserver's GraphQL API as an external system would launch it.

The webserver serves the repository's own workspace (the platform's code location) on a
temporary instance that holds the two demo runs. Screenshots go to ``test-artifacts/ui/``.
"""

from __future__ import annotations

import getpass
import time

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import expect

from core.registry import read_lineage
from tests.cli.demo_platform import shared_demo_platform
from tests.ui.browser import ARTIFACTS
from tests.ui.webserver import running_webserver

pytestmark = pytest.mark.slow

LOCATION = "platform"  # workspace.yaml: location_name platform
COMMENT = "UI check: reviewed the confusion on 8s"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    platform = shared_demo_platform(tmp_path_factory)
    out = platform.cli("comment", "digits", "2", COMMENT, "--author", "ui-test")
    assert out.returncode == 0, out.stderr
    return platform


@pytest.fixture(scope="module")
def ui_url(demo):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with running_webserver(demo.env(), ARTIFACTS / "webserver.log") as url:
        yield url


def test_asset_graph_shows_the_four_stages(page, ui_url):
    page.goto(f"{ui_url}/locations/{LOCATION}/asset-groups/digits")
    for stage in ("raw_dataset", "shards", "checkpoint", "model_version"):
        expect(page.get_by_text(stage, exact=True).first).to_be_visible()
    # Each stage's node shows it was materialized by the demo runs.
    expect(page.get_by_text("Materialized", exact=True).nth(3)).to_be_visible()
    page.screenshot(path=ARTIFACTS / "asset_graph.png", full_page=True)


def test_a_team_location_shows_the_platform_dataset_it_trains_on(page, ui_url):
    """teams/vision reads digits as the platform publishes it: its checkpoint's upstream lineage
    reaches digits/shards, an asset of the platform's location."""
    page.goto(f"{ui_url}/assets/digits_wide/checkpoint?view=lineage&lineageScope=upstream")
    expect(page.get_by_text("digits_wide", exact=False).first).to_be_visible()
    expect(page.get_by_text("shards", exact=True).first).to_be_visible()
    page.screenshot(path=ARTIFACTS / "team_location_lineage.png", full_page=True)
    page.goto(f"{ui_url}/assets/digits/shards")
    expect(page.get_by_text("platform", exact=False).first).to_be_visible()  # owned by the platform's location


def test_model_version_page_shows_metrics_and_lineage(page, ui_url, demo):
    record = read_lineage(demo.store(), "digits", 2)
    page.goto(f"{ui_url}/assets/digits/model_version")
    for key in ("version", "test_accuracy", "test_loss", "validation_accuracy", "quality_gate", "lineage"):
        expect(page.get_by_text(key, exact=True).first).to_be_visible()
    expect(page.get_by_text(str(record["evaluation"]["test"]["accuracy"]), exact=True).first).to_be_visible()
    expect(page.get_by_text("digits-v2", exact=True).first).to_be_visible()
    # The lineage Markdown renders as a table of the commits this version came from; a table this
    # long sits behind the UI's "[Show Markdown]" button.
    lineage_row = page.locator("tr", has=page.get_by_text("lineage", exact=True)).first
    show = lineage_row.get_by_text("[Show Markdown]")
    if show.count():
        show.click()
    for field, value in (("shards commit", record["data"]["shards_commit"]),
                         ("raw data commit", record["data"]["raw_commit"]),
                         ("dagster run", record["dagster"]["run_id"])):
        row = page.locator("tr", has=page.get_by_text(field, exact=True))
        expect(row.get_by_text(value, exact=True).first).to_be_visible()
    page.screenshot(path=ARTIFACTS / "model_version.png", full_page=True)


def test_checkpoint_page_shows_the_loss_curve(page, ui_url):
    page.goto(f"{ui_url}/assets/digits/checkpoint")
    row = page.locator("tr", has=page.get_by_text("loss_curve", exact=True))
    expect(row.first).to_be_visible()
    for figure in ("final_loss", "samples_per_second", "weights_sha256"):
        expect(page.get_by_text(figure, exact=True).first).to_be_visible()
    page.screenshot(path=ARTIFACTS / "checkpoint.png", full_page=True)
    # Large Markdown sits behind a button; the loss curve is a PNG inside it.
    row.first.get_by_text("[Show Markdown]").click()
    image = page.locator('img[alt="loss curve"]').first
    expect(image).to_be_visible()
    assert image.evaluate("img => img.complete && img.naturalWidth") > 100  # the PNG decoded
    page.screenshot(path=ARTIFACTS / "checkpoint_loss_curve.png")


def test_a_comment_from_the_cli_is_in_the_asset_history(page, ui_url):
    page.goto(f"{ui_url}/assets/digits/model_version?view=events")
    # The author is the identity the platform verified (locally the OS user); --author is a note.
    expect(page.get_by_text(f"Comment on v2 by {getpass.getuser()}: {COMMENT}").first).to_be_visible()
    expect(page.get_by_role("row", name="note ui-test").first).to_be_visible()
    expect(page.get_by_role("row", name="verified_by os-user").first).to_be_visible()
    expect(page.get_by_text(COMMENT, exact=True).first).to_be_visible()  # the `comment` metadata entry
    page.screenshot(path=ARTIFACTS / "model_version_events.png", full_page=True)


def test_a_run_launched_through_graphql_succeeds(ui_url, demo):
    """As an external system would: submit over GraphQL, poll the status until the run ends.

    The run re-ingests and re-shards digits (a subset of the training job) so that it stays cheap;
    the DefaultRunLauncher runs it in a subprocess of the webserver's code server.
    """
    host, port = ui_url.removeprefix("http://").split(":")
    client = DagsterGraphQLClient(host, port_number=int(port), timeout=120)
    selection = [dg.AssetKey(["digits", "raw_dataset"]), dg.AssetKey(["digits", "shards"])]
    run_id = client.submit_job_execution("digits_training", asset_selection=selection,
                                         tags={"submitted-by": "graphql-test"})
    final = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
    deadline = time.monotonic() + 480
    status = client.get_run_status(run_id)
    while status not in final and time.monotonic() < deadline:
        time.sleep(2)
        status = client.get_run_status(run_id)
    with dg.DagsterInstance.from_config(str(demo.home)) as instance:
        run = instance.get_run_by_id(run_id)
        events = instance.get_records_for_run(run_id).records
        materialized = {r.event_log_entry.dagster_event.asset_key.to_user_string() for r in events
                        if r.event_log_entry.dagster_event and r.event_log_entry.dagster_event.is_step_materialization}
        failures = [r.event_log_entry.dagster_event.message for r in events
                    if r.event_log_entry.dagster_event and r.event_log_entry.dagster_event.is_failure]
    assert status == dg.DagsterRunStatus.SUCCESS, f"run {run_id} ended {status}: {failures}"
    assert run.tags["submitted-by"] == "graphql-test"
    assert materialized == {"digits/raw_dataset", "digits/shards"}
