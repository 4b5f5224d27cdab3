"""A real Dagster webserver app (DagsterWebserver's ASGI app under uvicorn) in a thread of the test
process, over an instance with the platform's run coordinator and a one-op job: launch requests
travel over HTTP through Dagster's own GraphQL handler to the coordinator, as in production."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import uvicorn
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import instance_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_webserver.webserver import DagsterWebserver

from tests.support.ports import free_ports

LOCATION = "identity_test"
JOB = "toy_job"


@dg.op
def noop() -> None:
    """Does nothing: only the submission is under test."""


@dg.job(name=JOB)
def toy_job():
    noop()


defs = dg.Definitions(jobs=[toy_job])

LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId tags { key value } } }
    ... on PythonError { message }
  }
}"""


def coordinator_config(trust: bool, header: str = "X-Forwarded-Email") -> dict:
    return {"run_coordinator": {"module": "pipelines.run_coordinator", "class": "IdentityRunCoordinator",
                                "config": {"identity_header": header, "trust_identity_header": trust}}}


class Webserver:
    def __init__(self, url: str, instance: dg.DagsterInstance, process_context: WorkspaceProcessContext):
        self.url, self.instance, self.process_context = url, instance, process_context

    def launch(self, headers: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> dict:
        """POST a launchRun mutation as the UI's launchpad does; return its result object."""
        body = json.dumps({"query": LAUNCH, "variables": {"executionParams": {
            "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": JOB},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            # Dagster answers 500 when a resolver captured an error (a refused launch); the body is
            # still the GraphQL result.
            answer = json.loads(exc.read())
        return answer["data"]["launchRun"]


@contextlib.contextmanager
def running_webserver(trust: bool) -> Iterator[Webserver]:
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=str(Path(__file__)), attribute="defs"), location_name=LOCATION)
    with instance_for_test(overrides=coordinator_config(trust)) as instance, \
            WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process_context:
        app = DagsterWebserver(process_context).create_asgi_app()
        (port,) = free_ports(1)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, name="test-webserver", daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError("the in-process Dagster webserver did not start within 30 s")
                time.sleep(0.05)
            yield Webserver(f"http://127.0.0.1:{port}", instance, process_context)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
