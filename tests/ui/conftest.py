"""Browser fixtures of the tests in tests/ui: one headless Debian chromium per module, a fresh
page (context) per test; the constants and helpers they use are in tests/ui/browser.py."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.ui.browser import CHROMIUM, CHROMIUM_ARGS, new_page


@pytest.fixture(scope="module")
def browser() -> Browser:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser) -> Page:
    page = new_page(browser)
    yield page
    page.context.close()
