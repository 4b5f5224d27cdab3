"""lakeFS's own python-wrapper integration tests, run against the lakeFS test server (or a real
lakeFS when LAKEFS_ENDPOINT is set), with only configuration changed.

The tests are lakeFS's code, so they are not copied into this repository: this workplace does not
commit code brought in from another repository. They are read from a checkout named by
``LAKEFS_WRAPPER_TESTS`` (README.md here says which commit and how to get it); the checkout is
verified file by file against ``upstream.sha256`` before it runs, so a result always means
"lakeFS's published tests at that commit". Without the variable the suite is skipped, saying so.

Configuration is the only difference from upstream's own run, all of it in the environment the
wrapper and upstream's conftest read: the endpoint and keys (LAKECTL_*), the storage namespace
(STORAGE_NAMESPACE) and a lakectl config file that does not exist (a developer's
``~/.lakectl.yaml`` is never read). Tests of features the platform never uses are deselected by
name in DESELECTED, each with its reason.

The suite's own counts (passed, skipped with each reason, deselected with each reason, failed)
are what a run reports, not this test's one "passed": they go into the test's user properties,
which tests/store/conftest.py prints as a section of pytest's terminal summary (so ``make test``
shows them), into ``test-artifacts/lakefs-conformance.json``, and into the failure message.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import SUITE_PROPERTY
from tests.store.conftest import REAL_LAKEFS_ENV

HERE = Path(__file__).parent
REPORT = HERE.parents[2] / "test-artifacts" / "lakefs-conformance.json"
UPSTREAM_COMMIT = "332d1e28ec8e4025da154ad932efad82d18355f8"  # treeverse/lakeFS, python-wrapper 0.16.0
ENV = "LAKEFS_WRAPPER_TESTS"

# Tests of features the platform never uses, each with its reason. Keep this list short: every
# test of something the platform does use (repositories, branches, commits, log, merge, diff,
# tags, upload, stat, get, ranged get, delete, list, metadata) must run and pass.
DESELECTED = {
    "integration/test_import.py::test_import_manager":
        "import of external objects: the platform never imports; it also needs lakeFS's private "
        "bucket s3://esti-system-testing-data (on a local blockstore it skips itself)",
    "integration/test_import.py::test_import_manager_cancel":
        "import of external objects (as above)",
}
# What a run of the suite at UPSTREAM_COMMIT against the test server gives (README.md): the
# pre-signed cases skip themselves on a blockstore without pre-signed URLs, and nothing else does.
EXPECTED_ON_TEST_SERVER = {"passed": 68, "skipped": {"Storage adapter does not support pre-sign mode": 17}}


def upstream_tests() -> Path:
    location = os.environ.get(ENV)
    if not location:
        pytest.skip(f"lakeFS's wrapper tests are not part of this repository; check out treeverse/lakeFS at "
                    f"{UPSTREAM_COMMIT[:12]} and set {ENV}=<checkout>/clients/python-wrapper/tests "
                    "(tests/store/lakefs_conformance/README.md)")
    root = Path(location)
    listed = dict(reversed(line.split("  ", 1)) for line in (HERE / "upstream.sha256").read_text().splitlines())
    missing = [p for p in listed if not (root / p).is_file()]
    changed = [p for p in listed if p not in missing
               and hashlib.sha256((root / p).read_bytes()).hexdigest() != listed[p]]
    if missing or changed:
        pytest.fail(f"{ENV}={root} is not lakeFS's wrapper tests at {UPSTREAM_COMMIT[:12]}: missing {missing}, "
                    f"changed {changed}; check out that commit")
    return root


def suite_counts(junit: Path, wrapper: Path, stdout: str) -> dict:
    """The suite's own outcome, test by test, from its JUnit report, with its own summary line."""
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    passed, skipped, failed = [], Counter(), []
    where: dict[str, Counter] = {}
    for case in suite.iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}".removeprefix("tests/")
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            passed.append(name)
        elif outcome.tag == "skipped":
            reason = outcome.get("message", "").removeprefix("Skipped: ")
            skipped[reason] += 1
            # The text starts with "<file>:<line>: <reason>", where pytest.skip was called.
            location = (outcome.text or "").split(": ", 1)[0].removeprefix(f"{wrapper.parent}/")
            where.setdefault(reason, Counter())[location.removeprefix("tests/")] += 1
        else:
            failed.append(f"{name} ({outcome.tag}: {outcome.get('message', '')[:300]})")
    lines = [line for line in stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected)", line)]
    own_line = lines[-1].strip("= ") if lines else ""
    deselected = re.search(r"(\d+) deselected", own_line)
    return {"passed": len(passed), "skipped": dict(skipped), "skipped_at": {r: dict(c) for r, c in where.items()},
            "deselected": dict(DESELECTED), "deselected_by_pytest": int(deselected.group(1)) if deselected else 0,
            "failed": failed, "summary_line": own_line}


def _by_line(item: tuple[str, int]) -> tuple[str, int]:
    path, _, line = item[0].rpartition(":")
    return (path, int(line)) if line.isdigit() else (item[0], 0)


def describe(counts: dict, target: str) -> str:
    """What a user reads: the suite's counts, then each skip and deselection with its reason."""
    total_skipped = sum(counts["skipped"].values())
    text = [f"lakeFS's python-wrapper tests (treeverse/lakeFS {UPSTREAM_COMMIT[:12]}) against {target}: "
            f"{counts['passed']} passed, {total_skipped} skipped, {len(counts['deselected'])} deselected, "
            f"{len(counts['failed'])} failed (the suite's own line: {counts['summary_line'] or 'none'}; "
            f"{REPORT.relative_to(HERE.parents[2])})"]
    for reason, n in sorted(counts["skipped"].items()):
        at = ", ".join(f"{loc} x{k}" for loc, k in sorted(counts["skipped_at"][reason].items(), key=_by_line))
        text.append(f"  skipped {n}: {reason} ({at})")
    text += [f"  deselected {name}: {why}" for name, why in counts["deselected"].items()]
    text += [f"  FAILED {name}" for name in counts["failed"]]
    return "\n".join(text)


def test_lakefs_wrapper_integration_suite(request: pytest.FixtureRequest, record_property, tmp_path: Path):
    root = upstream_tests()
    if os.environ.get("LAKEFS_ENDPOINT"):
        missing = [name for name in REAL_LAKEFS_ENV if not os.environ.get(name)]
        assert not missing, f"LAKEFS_ENDPOINT is set but {', '.join(missing)} is not: set all of {REAL_LAKEFS_ENV}"
        endpoint, key_id, secret = (os.environ[name] for name in REAL_LAKEFS_ENV)
        prefix = os.environ.get("LAKEFS_STORAGE_NAMESPACE_PREFIX", "local://")
        target = f"lakeFS at {endpoint}"
    else:
        server = request.getfixturevalue("lakefs_server")
        endpoint, key_id, secret = server.direct_endpoint, server.access_key_id, server.secret_access_key
        prefix = "local://"
        target = "the lakeFS test server"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECTL_")}
    env.update(LAKECTL_SERVER_ENDPOINT_URL=endpoint, LAKECTL_CREDENTIALS_ACCESS_KEY_ID=key_id,
               LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=secret, LAKECTL_CONFIG_FILE=str(tmp_path / "no-lakectl.yaml"),
               STORAGE_NAMESPACE=(prefix if prefix.endswith("/") else prefix + "/") + "lakefs-conformance")
    junit = tmp_path / "junit.xml"
    deselect = [arg for name in DESELECTED for arg in ("--deselect", f"tests/{name}")]
    # Upstream imports its helpers as tests.integration.conftest and tests.utests.common: run from
    # the wrapper's folder, in a process of its own, so ``tests`` is lakeFS's package, not ours.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"--junitxml={junit}", "--timeout=300", *deselect],
        cwd=root.parent, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout[-6000:] + result.stderr[-2000:]
    assert junit.is_file(), f"lakeFS's wrapper suite wrote no report (exit {result.returncode}):\n{output}"
    counts = suite_counts(junit, root, result.stdout)
    summary = describe(counts, target)
    record_property(SUITE_PROPERTY, summary)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"upstream_commit": UPSTREAM_COMMIT, "target": target, **counts},
                                 indent=2, sort_keys=True) + "\n")
    assert not counts["failed"], f"{summary}\n\n{output}"
    assert counts["deselected_by_pytest"] == len(DESELECTED), (
        f"{summary}\n\nthe suite deselected {counts['deselected_by_pytest']} tests, DESELECTED names "
        f"{len(DESELECTED)}: a name there no longer matches an upstream test")
    if target == "the lakeFS test server":
        got = {"passed": counts["passed"], "skipped": counts["skipped"]}
        assert got == EXPECTED_ON_TEST_SERVER, f"{summary}\n\nexpected {EXPECTED_ON_TEST_SERVER}"
