"""The webserver's GraphQL endpoint under 50 concurrent clients reading runs and assets: no
errors; latency percentiles reported (never asserted: this machine is shared)."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.request

import pytest

from pipelines.definitions import build_definitions, training_job_name
from pipelines.models.digits import digits_pipeline, write_digits_source
from pipelines.profiles import Profile
from tests.reliability.conftest import FULL
from tests.ui.webserver import running_webserver

# make reliability runs it (all its cases); make test leaves it out to stay inside its 25 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

QUERIES = {
    "runs": "query { runsOrError(limit: 20) { ... on Runs { results { runId status startTime tags { key value } } } } }",
    "assets": "query { assetsOrError { ... on AssetConnection { nodes { key { path } "
              "assetMaterializations(limit: 5) { runId timestamp metadataEntries { label } } } } } }",
}


def _client(url: str, stop_at: float, latencies: list, errors: list, seed: int) -> None:
    names = list(QUERIES)
    i = seed
    while time.monotonic() < stop_at:
        name = names[i % len(names)]
        i += 1
        body = json.dumps({"query": QUERIES[name]}).encode()
        req = urllib.request.Request(url + "/graphql", data=body, headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                payload = json.loads(resp.read())
            if "errors" in payload or resp.status != 200:
                errors.append(f"{name}: {str(payload.get('errors'))[:200]}")
            else:
                latencies.append(time.perf_counter() - t0)
        except Exception as exc:  # every failure is counted and reported, none is hidden
            errors.append(f"{name}: {type(exc).__name__}: {exc}")


def test_graphql_under_concurrent_readers(tmp_path, ledger):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    profile = Profile(name="local", data_root=home / "platform")
    write_digits_source(profile.data_root / "sources")
    import dagster as dg

    defs = build_definitions(profile, [digits_pipeline])
    job = defs.resolve_job_def(training_job_name(digits_pipeline))
    with dg.DagsterInstance.from_config(str(home)) as instance:  # something to read: two stages materialized
        for _ in range(2):
            assert job.execute_in_process(instance=instance, asset_selection=[
                dg.AssetKey(["digits", "raw_dataset"]), dg.AssetKey(["digits", "shards"])]).success
    clients, duration = (50, 60.0) if FULL else (10, 5.0)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}, "DAGSTER_HOME": str(home)}
    latencies: list[float] = []
    errors: list[str] = []
    with running_webserver(env, tmp_path / "webserver.log") as url:
        stop_at = time.monotonic() + duration
        threads = [threading.Thread(target=_client, args=(url, stop_at, latencies, errors, i)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    q = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    note = (f"{clients} clients x {duration:.0f} s: {len(latencies)} requests, {len(errors)} errors, "
            f"p50 {q[49]*1000:.0f} ms, p95 {q[94]*1000:.0f} ms, p99 {q[98]*1000:.0f} ms")
    ledger.record("load: GraphQL readers", not errors and bool(latencies), not errors, note)
    print(note)
    assert not errors, errors[:5]
    assert latencies
