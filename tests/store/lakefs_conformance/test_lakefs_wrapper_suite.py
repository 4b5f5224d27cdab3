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
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.store.conftest import REAL_LAKEFS_ENV

HERE = Path(__file__).parent
UPSTREAM_COMMIT = "332d1e28ec8e4025da154ad932efad82d18355f8"  # treeverse/lakeFS, python-wrapper 0.16.0
ENV = "LAKEFS_WRAPPER_TESTS"

# Tests of features the platform never uses, each with its reason. Keep this list short: every
# test of something the platform does use (repositories, branches, commits, log, merge, diff,
# tags, upload, stat, get, ranged get, delete, list, metadata) must run and pass.
DESELECTED = {
    "integration/test_import.py::test_import_manager":
        "import of external objects: the platform never imports; it also needs lakeFS's private "
        "bucket s3://esti-system-testing-data",
    "integration/test_import.py::test_import_manager_cancel":
        "import of external objects (as above)",
    "integration/test_object.py::test_object_upload_exists[True]":
        "pre-signed upload: the platform never uses pre-signed URLs, and this case asks for one "
        "even where the blockstore has none (the other pre-signed cases skip themselves there)",
}
# What a run of the suite at UPSTREAM_COMMIT against the test server gives (README.md): the
# pre-signed cases skip themselves on a blockstore without pre-signed URLs.
EXPECTED_PASSED = 67


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


def test_lakefs_wrapper_integration_suite(request: pytest.FixtureRequest, tmp_path: Path):
    root = upstream_tests()
    if os.environ.get("LAKEFS_ENDPOINT"):
        missing = [name for name in REAL_LAKEFS_ENV if not os.environ.get(name)]
        assert not missing, f"LAKEFS_ENDPOINT is set but {', '.join(missing)} is not: set all of {REAL_LAKEFS_ENV}"
        endpoint, key_id, secret = (os.environ[name] for name in REAL_LAKEFS_ENV)
        prefix = os.environ.get("LAKEFS_STORAGE_NAMESPACE_PREFIX", "local://")
    else:
        server = request.getfixturevalue("lakefs_server")
        endpoint, key_id, secret = server.direct_endpoint, server.access_key_id, server.secret_access_key
        prefix = "local://"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECTL_")}
    env.update(LAKECTL_SERVER_ENDPOINT_URL=endpoint, LAKECTL_CREDENTIALS_ACCESS_KEY_ID=key_id,
               LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=secret, LAKECTL_CONFIG_FILE=str(tmp_path / "no-lakectl.yaml"),
               STORAGE_NAMESPACE=(prefix if prefix.endswith("/") else prefix + "/") + "lakefs-conformance")
    report = tmp_path / "junit.xml"
    deselect = [arg for name in DESELECTED for arg in ("--deselect", f"tests/{name}")]
    # Upstream imports its helpers as tests.integration.conftest and tests.utests.common: run from
    # the wrapper's folder, in a process of its own, so ``tests`` is lakeFS's package, not ours.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"--junitxml={report}", "--timeout=300", *deselect],
        cwd=root.parent, env=env, capture_output=True, text=True, timeout=900)
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed, errors, skipped = (int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    passed = int(suite.get("tests", 0)) - failed - errors - skipped
    assert failed == 0 and errors == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert passed >= EXPECTED_PASSED, (f"{passed} passed, fewer than the {EXPECTED_PASSED} of a full run; "
                                       + result.stdout[-3000:])
