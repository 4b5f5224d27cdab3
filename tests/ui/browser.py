"""What every browser test of tests/ui shares: Debian's chromium, how pages are opened, where
screenshots go, and a temporary home whose workspace serves one test code location.
The fixtures built on them (``browser``, ``page``) are in tests/ui/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Browser, Page, expect

from pipelines.models.digits import write_digits_source
from tests.cli.demo_platform import INSTANCE_YAML
from tests.ui.webserver import REPO

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
