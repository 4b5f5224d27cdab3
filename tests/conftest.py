"""Hooks for the whole suite. They live here, at the top of tests/, because under pytest-xdist
(``make test`` runs in parallel) only this conftest is loaded in the controlling process, which
is where the terminal summary is written."""

from __future__ import annotations

import pytest

# The user property under which store/lakefs_conformance/test_lakefs_wrapper_suite.py records the
# counts of lakeFS's own suite; pytest_terminal_summary below prints them.
SUITE_PROPERTY = "lakefs_wrapper_suite"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print lakeFS's wrapper suite's own counts where ``make test`` shows them: that suite runs
    as one test here, whose "1 passed" would hide how many of lakeFS's tests ran, skipped or
    were deselected, and why. Read from the test reports, which xdist's workers send back with
    their user properties."""
    reports = [r for name, rows in terminalreporter.stats.items() if name != "warnings" for r in rows
               if getattr(r, "when", None) == "call"]
    for report in reports:
        for name, value in getattr(report, "user_properties", ()):
            if name == SUITE_PROPERTY:
                terminalreporter.write_sep("-", "lakeFS's own wrapper tests (tests/store/lakefs_conformance)")
                terminalreporter.write_line(str(value))


# ---------------------------------------------------------------- make test and make test-all
# make test (`-m "not heavy and not full"`) leaves these to make test-all, which CI runs. Each entry
# is a node id prefix (a file, a test, or a test with its parameters) and the reason: another
# test in make test already runs that path end to end, so these add cases, not layers. They are
# listed here rather than marked in their files so the split between the suites reads in one
# place; every entry must still match a test (checked when the whole suite is collected).
FULL_ONLY: dict[str, str] = {
}


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by -m
def pytest_collection_modifyitems(config, items) -> None:
    matched: set[str] = set()
    for item in items:
        for prefix in FULL_ONLY:
            if item.nodeid == prefix or item.nodeid.startswith((prefix + "::", prefix + "[")):
                item.add_marker(pytest.mark.full)
                matched.add(prefix)
    whole_suite = [str(a).rstrip("/") for a in config.args] == ["tests"] and not config.option.keyword
    stale = sorted(set(FULL_ONLY) - matched)
    if whole_suite and stale:
        raise pytest.UsageError(f"tests/conftest.py FULL_ONLY names tests that no longer exist: {stale}")
