"""What every browser test of tests/ui shares: Debian's chromium, how pages are opened, where
screenshots go, and a temporary home whose workspace serves one test code location.
The fixtures built on them (``browser``, ``page``) are in tests/ui/conftest.py."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import dagster as dg
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import Browser, Page, expect

from pipelines.models.digits import write_digits_source
from tests.cli.demo_platform import INSTANCE_YAML
from tests.ui.webserver import REPO, running_webserver

ARTIFACTS = REPO / "test-artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
UI_TIMEOUT_MS = 90_000  # first renders of a page on two busy cores are slow


def new_page(browser: Browser, width: int = 1600, height: int = 1000) -> Page:
    """A page in a fresh browser context, with the slow-machine timeouts. On a new instance the
    Dagster UI greets with "Join the Dagster community" over the page: it is skipped whenever it shows."""
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    expect.set_options(timeout=UI_TIMEOUT_MS)
    page.add_locator_handler(page.get_by_role("button", name="Skip"), lambda skip: skip.click())
    return page


def write_home(root: Path, module: str, location: str, attribute: str = "defs") -> Path:
    """``root/home``, a DAGSTER_HOME with telemetry off, runs launched without a daemon's queue and
    the digits source, beside ``root/workspace.yaml``, which serves ``module:attribute`` as ``location``."""
    home = root / "home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    write_digits_source(home / "platform" / "sources")
    (root / "workspace.yaml").write_text(f"""\
load_from:
  - python_module:
      module_name: {module}
      attribute: {attribute}
      location_name: {location}
      working_directory: {REPO}
""")
    return home


def home_env(home: Path) -> dict[str, str]:
    """This process's environment for servers on ``home``, on the local profile."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE")}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO))
    return env


@contextlib.contextmanager
def launched_run(home: Path, workspace: Path, log_name: str, job: str,
                 submitted_by: str) -> Iterator[tuple[str, dg.DagsterInstance, str]]:
    """A webserver on ``home`` serving ``workspace``, and a run of ``job`` launched through its
    GraphQL API as a user's launch from the UI would be: yields (the UI's URL, the instance, the
    run's id). The webserver's log goes to ``ARTIFACTS / log_name``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with running_webserver(home_env(home), ARTIFACTS / log_name, workspace=workspace) as url, \
            dg.DagsterInstance.from_config(str(home)) as instance:
        host, port = url.removeprefix("http://").split(":")
        client = DagsterGraphQLClient(host, port_number=int(port), timeout=120)
        yield url, instance, client.submit_job_execution(job, tags={"submitted-by": submitted_by})
