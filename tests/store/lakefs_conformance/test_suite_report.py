"""How the conformance harness reads lakeFS's suite: its own counts, each skip and deselection
with its reason, and every failure by name, from the JUnit report pytest writes. Runs without
lakeFS's checkout, so the reporting is checked wherever ``make test`` runs."""

from __future__ import annotations

from pathlib import Path

from tests.store.lakefs_conformance.test_lakefs_wrapper_suite import DESELECTED, describe, suite_counts

WRAPPER = Path("/checkout/clients/python-wrapper/tests")
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="3" tests="7">
  <testcase classname="tests.integration.test_branch" name="test_branch_create" time="0.1"/>
  <testcase classname="tests.integration.test_branch" name="test_branch_delete" time="0.1"/>
  <testcase classname="tests.integration.test_object" name="test_presign[True]" time="0.0">
    <skipped type="pytest.skip" message="Storage adapter does not support pre-sign mode">/checkout/clients/python-wrapper/tests/integration/test_object.py:108: Storage adapter does not support pre-sign mode</skipped>
  </testcase>
  <testcase classname="tests.integration.test_object" name="test_presign[False]" time="0.0">
    <skipped type="pytest.skip" message="Storage adapter does not support pre-sign mode">/checkout/clients/python-wrapper/tests/integration/test_object.py:108: Storage adapter does not support pre-sign mode</skipped>
  </testcase>
  <testcase classname="tests.integration.test_import" name="test_import" time="0.0">
    <skipped type="pytest.skip" message="Unsupported blockstore type for test: local">/checkout/clients/python-wrapper/tests/integration/test_import.py:22: Unsupported blockstore type for test: local</skipped>
  </testcase>
  <testcase classname="tests.integration.test_merge" name="test_merge_conflict" time="0.2">
    <failure message="AssertionError: 409 != 200">long traceback</failure>
  </testcase>
  <testcase classname="tests.integration.test_tag" name="test_tag_list" time="0.2">
    <error message="failed on setup with ConnectionError">long traceback</error>
  </testcase>
</testsuite></testsuites>
"""
STDOUT = "..ss.sFE\n=== 1 failed, 2 passed, 3 skipped, 2 deselected, 1 error in 3.21s ===\n"


def test_the_suites_own_counts_and_reasons(tmp_path: Path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    counts = suite_counts(junit, WRAPPER, STDOUT)
    assert counts["passed"] == 2
    assert counts["skipped"] == {"Storage adapter does not support pre-sign mode": 2,
                                 "Unsupported blockstore type for test: local": 1}
    assert counts["skipped_at"]["Storage adapter does not support pre-sign mode"] == {
        "integration/test_object.py:108": 2}
    assert counts["failed"] == ["integration/test_merge.py::test_merge_conflict (failure: AssertionError: 409 != 200)",
                                "integration/test_tag.py::test_tag_list (error: failed on setup with ConnectionError)"]
    assert counts["summary_line"] == "1 failed, 2 passed, 3 skipped, 2 deselected, 1 error in 3.21s"
    assert counts["deselected_by_pytest"] == 2 and counts["deselected"] == DESELECTED

    text = describe(counts, "the lakeFS test server").splitlines()
    assert text[0].startswith("lakeFS's python-wrapper tests (treeverse/lakeFS 332d1e28ec8e) against the lakeFS "
                              "test server: 2 passed, 3 skipped, 2 deselected, 2 failed")
    assert "  skipped 2: Storage adapter does not support pre-sign mode (integration/test_object.py:108 x2)" in text
    assert "  skipped 1: Unsupported blockstore type for test: local (integration/test_import.py:22 x1)" in text
    assert [line for line in text if line.startswith("  deselected ")] == [
        f"  deselected {name}: {why}" for name, why in DESELECTED.items()]
    assert text[-1] == "  FAILED integration/test_tag.py::test_tag_list (error: failed on setup with ConnectionError)"
