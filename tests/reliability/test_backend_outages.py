"""The store (lakeFS) answering errors mid-run, and the S3 server going away mid-run: bounded
retries ride out short outages; a long one fails the run with a clear message and nothing is
published half."""

from __future__ import annotations

import random
import threading
import time

import pytest

from resources.platform import ArtifactStoreResource, VersionedStoreResource
from tests.reliability.conftest import repeats
from tests.reliability.platforms import definitions, lakefs_store_resource, published_whole_or_untouched, run_train
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.seaweed import SeaweedServer

pytestmark = pytest.mark.slow
SECRET = "outage-test-secret"


def _inject_later(server: LakeFSTestServer, delay_s: float, kind: str, count: int) -> threading.Timer:
    timer = threading.Timer(delay_s, server.inject, args=(kind, count))
    timer.start()
    return timer


@pytest.fixture
def lakefs(tmp_path, monkeypatch):
    with LakeFSTestServer(tmp_path / "lakefs", access_key_id="AKIAOUTAGE", secret_access_key=SECRET,
                          stall_s=5) as server:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield server


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_store_errors_shorter_than_the_retry_budget_are_survived(tmp_path, lakefs, ledger, case):
    rng = random.Random(case)
    kind = rng.choice(["503", "500", "reset"])
    store_resource = lakefs_store_resource(lakefs, SECRET)
    timer = _inject_later(lakefs, rng.uniform(0.5, 20.0), kind, 2)  # the client tries 5 times
    result, errors, _ = run_train(definitions(tmp_path / "platform", store_resource), tmp_path / "home")
    timer.cancel()
    store = store_resource.get()
    ok = result.success
    ledger.record("fault: store answering errors mid-run (transient)", ok,
                  ok and bool(store.list_tags()), f"2 x {kind} at a random moment")
    assert ok, errors


@pytest.mark.parametrize("case", range(repeats(10, 1)))
def test_store_outage_longer_than_retries_fails_clearly_and_publishes_nothing_half(tmp_path, lakefs, ledger, case):
    rng = random.Random(1000 + case)
    store_resource = lakefs_store_resource(lakefs, SECRET)
    store = store_resource.get()
    store.ensure_repository()
    main_before = store.resolve_ref("main")
    timer = _inject_later(lakefs, rng.uniform(0.5, 25.0), "503", 10_000)
    result, errors, _ = run_train(definitions(tmp_path / "platform", store_resource), tmp_path / "home")
    timer.cancel()
    lakefs.proxy.clear()  # the outage ends; now look at what it left
    clear = (not result.success) and ("kept failing after" in errors or "attempts" in errors)
    whole = published_whole_or_untouched(store, main_before)
    if result.success:  # the outage began after the run had finished: nothing to refuse
        clear = True
    ledger.record("fault: store down mid-run (beyond retries)", clear, whole,
                  "503 from a random moment on; main unchanged or fully published")
    assert clear, errors
    assert whole


@pytest.mark.parametrize("case", range(repeats(3, 1)))
def test_s3_server_stopped_mid_run_fails_clearly_and_publishes_nothing(tmp_path, monkeypatch, ledger, case):
    with SeaweedServer(tmp_path / "weed") as s3:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_access_key)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        root = tmp_path / "platform"
        store_resource = VersionedStoreResource(kind="local", local_root=str(root / "store"))
        artifacts = ArtifactStoreResource(kind="s3", bucket=s3.bucket, prefix=f"case{case}", endpoint_url=s3.endpoint_url)
        store = store_resource.get()
        store.ensure_repository()
        main_before = store.resolve_ref("main")
        ckpts = root / "checkpoints" / "digits"

        def stop_when_training():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not any(ckpts.glob("*/checkpoints/step_*")):
                time.sleep(0.2)
            s3.stop()

        stopper = threading.Thread(target=stop_when_training)
        stopper.start()
        result, errors, _ = run_train(definitions(root, store_resource, artifacts), tmp_path / "home")
        stopper.join()
    clear = not result.success and ("S3" in errors or "s3" in errors)
    untouched = store.resolve_ref("main") == main_before
    ledger.record("fault: S3 server stopped mid-run", clear, untouched, "weights upload after the server stopped")
    assert clear, errors
    assert untouched
