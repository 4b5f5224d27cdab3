"""``python -m pipelines tensorboard digits`` serving the demo's two real versions, and the scalars
page it serves loaded in a headless Chromium. The screenshot (``test-artifacts/ui/tensorboard.png``)
is the one README shows (docs/images/tensorboard.png)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.cli.demo_platform import shared_demo_platform
from tests.support.ports import free_ports
from tests.ui.browser import ARTIFACTS, new_page
from tests.ui.webserver import REPO, _stop_group

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 180.0  # the CLI copies the event files, then TensorBoard starts: slow on two busy cores


@pytest.fixture(scope="module")
def tensorboard_url(tmp_path_factory):
    """The URL of the TensorBoard the CLI serves for the demo's digits versions."""
    demo = shared_demo_platform(tmp_path_factory)
    logdir = tmp_path_factory.mktemp("tensorboard") / "digits"
    (port,) = free_ports(1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / "tensorboard.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "tensorboard", "digits", "--port", str(port), "--logdir", str(logdir)],
            cwd=REPO, env=demo.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_runs(proc, url, {"v1", "v2"}, log_path)
        yield url
    finally:
        _stop_group(proc)


def _wait_for_runs(proc: subprocess.Popen, url: str, runs: set[str], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the tensorboard command exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/data/runs", timeout=5) as resp:
                if runs <= set(json.loads(resp.read())):
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        time.sleep(1.0)  # listening, but still loading the event files
    raise TimeoutError(f"TensorBoard did not list runs {sorted(runs)} at {url} within {START_TIMEOUT_S:.0f} s:\n"
                       f"{log_path.read_text()[-3000:]}")


def test_the_scalars_page_shows_the_training_loss_of_both_versions(tensorboard_url, browser):
    page = new_page(browser, 1400, 900)
    try:
        # The scalars dashboard, training figures only, unsmoothed (state lives in the URL's hash).
        page.goto(f"{tensorboard_url}/#scalars&tagFilter=%5Etrain%2F(loss%7Clr)%24&_smoothingWeight=0")
        # Each card's heading is its tag (the "tag: ..." subtitle only shows when a display name differs).
        expect(page.locator("tf-scalar-card").get_by_text("train/loss", exact=True)).to_be_visible()
        expect(page.locator("tf-scalar-card").get_by_text("train/lr", exact=True)).to_be_visible()
        for run in ("v1", "v2"):  # one run per version in the run selector
            expect(page.get_by_text(run, exact=True).first).to_be_visible()
        # The card's chart draws one line per run once the scalars arrive.
        card = page.locator("tf-scalar-card").filter(has=page.get_by_text("train/loss", exact=True))
        expect(card.locator("svg path.line")).to_have_count(2)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=ARTIFACTS / "tensorboard.png")
    finally:
        page.context.close()
