"""The soak's load besides the pipelines' own automation: new-data commits of digits (whose
sensor retrains it, and whose new published version the team's sensor retrains on), wine runs
started whenever none is in flight (as a person pressing Materialize would), and a reader
polling the UI's GraphQL. Each runs in a thread until ``stop`` is set and records what it did."""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from dagster_graphql import DagsterGraphQLClient

from pipelines.automation import IN_FLIGHT, MODEL_TAG
from pipelines.models.digits import digits_frame
from pipelines.sources import add_source_files, plan_uploads
from tests.reliability.soak.pipelines import DIGITS, DIGITS_SOURCE, JOBS

REPOSITORY_NAME = "__repository__"  # the one repository of a Definitions code location
GRAPHQL_QUERIES = {
    "runs": "query { runsOrError(limit: 20) { ... on Runs { results { runId status startTime tags { key value } } } "
            "... on PythonError { message } } }",
    "assets": "query { assetsOrError { ... on AssetConnection { nodes { key { path } "
              "assetMaterializations(limit: 1) { runId timestamp } } } ... on PythonError { message } } }",
}


class Clock:
    """Seconds since the soak began, for every record."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)


def digits_variant(rng: random.Random, path: Path) -> Path:
    """A new version of the digits source: 93-100 % of the images, in a new order, so every
    commit is new data (a new dataset version, which the team's sensor then trains on)."""
    frame = digits_frame()
    keep = frame.sample(frac=rng.uniform(0.93, 1.0), random_state=rng.randrange(2**31))
    keep.to_csv(path, index=False)
    return path


@dataclass
class Commits:
    """New-data commits of digits through ``pipelines.sources.add_source_files`` (what
    ``python -m pipelines sources add digits FILE --to digits/digits.csv`` runs), made through
    the store's fault proxy, as a user's upload would be."""

    store: object
    rng: random.Random
    clock: Clock
    every_s: tuple[float, float]
    records: list[dict] = field(default_factory=list)

    def commit_once(self) -> dict:
        at = self.clock.now()
        with tempfile.TemporaryDirectory(prefix="soak-digits-") as tmp:
            local = digits_variant(self.rng, Path(tmp) / "digits.csv")
            try:
                uploads = plan_uploads(DIGITS, [local], to=DIGITS_SOURCE)
                done = add_source_files(self.store, DIGITS, uploads, {"added_with": "the soak"})
                record = {"at": at, "ok": True, "main": done.main_commit_id}
            except Exception as exc:  # noqa: BLE001 - a failed upload during an outage is recorded, not hidden
                record = {"at": at, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        self.records.append(record)
        return record

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(*self.every_s)):
            self.commit_once()


def submit(client: DagsterGraphQLClient, model: str, run_config: dict | None = None,
           tags: dict[str, str] | None = None) -> str:
    location, job = JOBS[model]
    return client.submit_job_execution(job, repository_location_name=location, repository_name=REPOSITORY_NAME,
                                       run_config=run_config or {}, tags=tags or {})


def in_flight(instance: dg.DagsterInstance, model: str) -> list[str]:
    return [r.run_id for r in instance.get_runs(dg.RunsFilter(tags={MODEL_TAG: model}, statuses=IN_FLIGHT))]


@dataclass
class Retrains:
    """Runs of ``model`` submitted through the webserver whenever none is queued or running."""

    client: DagsterGraphQLClient
    home: Path
    model: str
    clock: Clock
    records: list[dict] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            while not stop.wait(5.0):
                if in_flight(instance, self.model):
                    continue
                at = self.clock.now()
                try:
                    self.records.append({"at": at, "run_id": submit(self.client, self.model)})
                except Exception as exc:  # noqa: BLE001 - recorded: a refused submission is a finding
                    self.records.append({"at": at, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})


@dataclass
class GraphQLReader:
    """Polls the webserver's GraphQL (runs and assets) every ``every_s``; latencies and errors."""

    url: str
    clock: Clock
    every_s: float = 2.0
    latencies_s: list[float] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)

    def read_once(self, name: str) -> None:
        body = json.dumps({"query": GRAPHQL_QUERIES[name]}).encode()
        request = urllib.request.Request(self.url + "/graphql", data=body, headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                payload = json.loads(resp.read())
            problem = payload.get("errors") or _python_error(payload)
            if problem:
                self.errors.append({"at": self.clock.now(), "query": name, "error": str(problem)[:300]})
            else:
                self.latencies_s.append(time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - every failed read is counted and reported
            self.errors.append({"at": self.clock.now(), "query": name, "error": f"{type(exc).__name__}: {exc}"[:300]})

    def run(self, stop: threading.Event) -> None:
        names = list(GRAPHQL_QUERIES)
        i = 0
        while not stop.wait(self.every_s):
            self.read_once(names[i % len(names)])
            i += 1


def _python_error(payload: dict) -> str | None:
    """A resolver's PythonError (GraphQL answers it as data, not as an error)."""
    for value in (payload.get("data") or {}).values():
        if isinstance(value, dict) and value.get("message") and "results" not in value and "nodes" not in value:
            return value["message"]
    return None
