"""A training watched live in TensorBoard, as ``make ui`` serves it: ``python -m pipelines.local_ui``
starts dagster dev and TensorBoard together on a temporary home; a run of digits is launched
through the webserver (GraphQL), as from the UI; from its first telemetry interval the run's log
and an observation of the checkpoint carry the link; the link, opened in a headless Chromium,
shows this run's curves and not another run's, and TensorBoard's scalars for the run hold more
points the second time they are read, while the run still trains. Stopping the launcher stops both
servers. Screenshots: ``test-artifacts/ui/live_tensorboard_run_log.png``, ``live_tensorboard.png``
(docs/images/ holds copies of both, docs/experiments.md "Live curves").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import Page, expect

from ops.live_tensorboard import LINK_KEY
from tests.cli.tensorboard_versions import _Quiet
from tests.support.ports import free_ports
from tests.ui.browser import ARTIFACTS, home_env, new_page, write_home
from tests.ui.webserver import REPO
from training_runtime.observe.tensorboard import TensorBoardReporter

pytestmark = pytest.mark.slow

CHECKPOINT = dg.AssetKey(["digits", "checkpoint"])
DECOY = "models/digits/checkpoints/an-earlier-run/tensorboard"  # another run's curves in the same TensorBoard
START_TIMEOUT_S = 240.0  # dagster dev loads the code location on two busy cores
WAIT_S = 600.0  # ingest and sharding come first
MORE_POINTS = 5  # telemetry intervals the second read must add
FINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
STOP_S = 60.0
LOSS_CARD = re.compile(r"^\s*train\s*/\s*loss\s*$")  # a card's title: TensorBoard sets the last part apart


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def make_ui(home: Path, log_path: Path) -> Iterator[tuple[str, str, subprocess.Popen, tuple[int, int]]]:
    """``make ui``'s program on ``home``; yields the UI's and TensorBoard's URLs, the launcher and the ports."""
    ports = free_ports(2)
    command = [sys.executable, "-m", "pipelines.local_ui", "--port", str(ports[0]), "--tensorboard-port",
               str(ports[1]), "--workspace", str(home.parent / "workspace.yaml"), "--reload-s", "1"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=home_env(home), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    ui, board = (f"http://127.0.0.1:{p}" for p in ports)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (_answers(ui + "/server_info") and _answers(board + "/data/environment")):
            assert proc.poll() is None, f"make ui exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"make ui did not serve within {START_TIMEOUT_S:.0f} s:\n" \
                                                f"{log_path.read_text()[-3000:]}"
            time.sleep(1.0)
        yield ui, board, proc, tuple(ports)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl+C in make ui's terminal sends
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _link(instance: dg.DagsterInstance, run_id: str) -> str:
    """The TensorBoard link of the run's first observation that carries one; waits for it."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
        for record in records:
            observation = record.event_log_entry.dagster_event.asset_observation_data.asset_observation
            if observation.asset_key == CHECKPOINT and LINK_KEY in observation.metadata:
                return observation.metadata[LINK_KEY].value
        run = instance.get_run_by_id(run_id)
        assert run.status not in FINAL, f"run {run_id} ended {run.status} without a TensorBoard link"
        time.sleep(1.0)
    raise TimeoutError(f"run {run_id}: no TensorBoard link after {WAIT_S:.0f} s")


def _run_name(board: str, run_id: str) -> str:
    with urllib.request.urlopen(board + "/data/runs", timeout=10) as resp:
        names = [n for n in json.loads(resp.read()) if run_id in n]
    return names[0] if names else ""


def _steps(page: Page, board: str, run: str) -> list[int]:
    """The steps of the run's train/loss that TensorBoard serves now, read through the page's session."""
    query = urllib.parse.urlencode({"run": run, "tag": "train/loss"})
    answer = page.request.get(f"{board}/data/plugin/scalars/scalars?{query}")
    return [point[1] for point in answer.json()] if answer.ok else []


def _wait_for_steps(page: Page, board: str, run: str, more_than: int, instance, run_id: str) -> list[int]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        steps = _steps(page, board, run)
        if len(steps) > more_than:
            return steps
        assert instance.get_run_by_id(run_id).status not in FINAL, f"run ended with {len(steps)} point(s) shown"
        time.sleep(1.0)
    raise TimeoutError(f"TensorBoard never showed more than {more_than} point(s) of {run}")


def _write_decoy(home: Path) -> None:
    with TensorBoardReporter(_Quiet(), home / "platform" / "artifacts" / DECOY) as reporter:
        for step in (10, 20, 30):
            reporter.custom({"kind": "telemetry", "step": step, "loss": 5.0})


def test_the_run_links_a_tensorboard_view_whose_curve_grows_while_it_trains(tmp_path, browser):
    home = write_home(tmp_path, "tests.ui.tensorboard_definitions", "live_tensorboard")
    _write_decoy(home)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with make_ui(home, ARTIFACTS / "live_tensorboard_make_ui.log") as (ui, board, launcher, ports), \
            dg.DagsterInstance.from_config(str(home)) as instance:
        host, port = ui.removeprefix("http://").split(":")
        run_id = DagsterGraphQLClient(host, port_number=int(port), timeout=120).submit_job_execution(
            "digits_training", tags={"submitted-by": "live-tensorboard-test"})

        link = _link(instance, run_id)
        # The link names make ui's TensorBoard (the profile's setting, not a fixed port) and this run.
        assert link.startswith(board + "/?runFilter=") and link.endswith("#timeseries")
        logs = [r.event_log_entry.user_message for r in instance.get_records_for_run(run_id).records
                if r.event_log_entry.dagster_event is None]
        assert f"TensorBoard of this run, live while it trains: {link}" in logs

        page = new_page(browser, 1400, 900)
        try:
            page.goto(link)
            run = _run_name(board, run_id)
            assert run == f"digits/checkpoints/{run_id}/tensorboard"
            first = _wait_for_steps(page, board, run, 0, instance, run_id)
            # The loss is pinned at the top of the view.
            expect(page.get_by_text(LOSS_CARD).first).to_be_visible()
            # This run's curves only: the earlier run in the same TensorBoard is filtered out.
            expect(page.get_by_text(run, exact=True).first).to_be_visible()
            expect(page.get_by_text(DECOY.removeprefix("models/"), exact=True)).to_have_count(0)
            assert instance.get_run_by_id(run_id).status not in FINAL, "read after the training ended"

            second = _wait_for_steps(page, board, run, len(first) + MORE_POINTS - 1, instance, run_id)
            assert instance.get_run_by_id(run_id).status not in FINAL, "read after the training ended"
            page.reload()
            expect(page.get_by_text(LOSS_CARD).first).to_be_visible()
            page.get_by_role("button", name="Toggle settings side pane").click()  # more room for the charts
            page.wait_for_timeout(2000)  # the charts draw the points just loaded
            page.screenshot(path=ARTIFACTS / "live_tensorboard.png")

            # The run's log in the UI shows the link too (it stays there once the run has ended).
            page.goto(f"{ui}/runs/{run_id}")
            page.get_by_placeholder(re.compile(r"^Filter")).first.fill("TensorBoard")
            expect(page.get_by_text(link).first).to_be_visible()
            page.screenshot(path=ARTIFACTS / "live_tensorboard_run_log.png")
        finally:
            page.context.close()
        assert max(second) > max(first) and len(second) >= len(first) + MORE_POINTS, (first, second)
    # Stopped like Ctrl+C: the launcher ends cleanly and neither server is left.
    assert launcher.returncode == 0, (ARTIFACTS / "live_tensorboard_make_ui.log").read_text()[-3000:]
    assert not _listening(ports[0]) and not _listening(ports[1])
