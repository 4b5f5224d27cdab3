"""Hooks for the whole suite. They live here, at the top of tests/, because under pytest-xdist
(``make test`` runs in parallel) only this conftest is loaded in the controlling process, which
is where the terminal summary is written."""

from __future__ import annotations

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
