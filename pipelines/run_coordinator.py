"""The production instance's run coordinator: Dagster's QueuedRunCoordinator, plus who launched each run.

Dagster OSS records no user on a run, and every tag of a launch request is the client's to choose.
This is the hook Dagster offers for it ("run attribution"): the webserver calls the coordinator's
``submit_run`` with the HTTP request the launch came in on, whose headers
``SubmitRunContext.get_request_header`` reads. Behind the chart's authenticating proxy
(helm/model-factory ``authProxy``), the identity header is the proxy's: it removes a client's copy
and sets its own, and the chart's NetworkPolicy lets only the proxy reach the webserver.

On every submission the coordinator writes ``platform/launched_by*`` (core/identity.py), so a value a
client typed into the launchpad never survives. Runs the daemon submits (schedules, sensors,
backfills) are "not verified"; a retry keeps its parent's identity. A launch request without the
header (it went around the proxy), or with one while no proxy is configured, is refused
(core.identity.IdentityRefused).

Configured in the instance (helm/dagster-values.yaml ``customRunCoordinator``, helm/instance/dagster.yaml)::

    run_coordinator:
      module: pipelines.run_coordinator
      class: IdentityRunCoordinator
      config: {identity_header: X-Forwarded-Email, trust_identity_header: true, <QueuedRunCoordinator's settings>}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import Field
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.workspace.context import WorkspaceRequestContext
from dagster._serdes import ConfigurableClassData

from core.identity import (
    DEFAULT_IDENTITY_HEADER,
    PARENT_RUN_TAG,
    PROXY_IDENTITY_HEADERS,
    check_identity_header,
    identity_from_header,
    inherited_identity_tags,
    launch_identity_tags,
)

HEADER_KEY = "identity_header"
TRUST_KEY = "trust_identity_header"


class IdentityRunCoordinator(QueuedRunCoordinator):
    """QueuedRunCoordinator that tags each run with the user the authenticating proxy signed in."""

    identity_header: str = DEFAULT_IDENTITY_HEADER
    trust_identity_header: bool = False

    @classmethod
    def config_type(cls) -> dict:
        return {
            **QueuedRunCoordinator.config_type(),
            HEADER_KEY: Field(str, is_required=False, default_value=DEFAULT_IDENTITY_HEADER,
                              description="The header the authenticating proxy sets with the signed-in user, one of "
                                          + ", ".join(PROXY_IDENTITY_HEADERS) + "."),
            TRUST_KEY: Field(bool, is_required=False, default_value=False,
                             description="true only where the authenticating proxy is the webserver's sole way in "
                                         "(helm/model-factory authProxy): launches without the header are then "
                                         "refused. false: launches carrying the header are refused."),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        queued = {k: v for k, v in config_value.items() if k not in (HEADER_KEY, TRUST_KEY)}
        coordinator = super().from_config_value(inst_data, queued)
        coordinator.configure_identity(config_value.get(HEADER_KEY, DEFAULT_IDENTITY_HEADER),
                                       bool(config_value.get(TRUST_KEY, False)))
        return coordinator

    def configure_identity(self, header: str, trust: bool) -> None:
        self.identity_header = check_identity_header(header)
        self.trust_identity_header = trust

    @property
    def verifies_launch_identity(self) -> bool:
        """Whether this instance's runs carry launch identities a reader may trust (ops/runs.py)."""
        return self.trust_identity_header

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        # A refusal (IdentityRefused) propagates: Dagster then marks the run, which the webserver
        # has already created, failed with the message, and the launchpad shows it.
        self._instance.add_run_tags(context.dagster_run.run_id, self.identity_tags(context))
        return super().submit_run(context)

    def identity_tags(self, context: SubmitRunContext) -> dict[str, str]:
        run = context.dagster_run
        if from_http_request(context):
            actor = identity_from_header(context.get_request_header(self.identity_header),
                                         header=self.identity_header, trusted=self.trust_identity_header)
            return launch_identity_tags(actor, run.run_id)
        parent_id = run.tags.get(PARENT_RUN_TAG)
        parent = self._instance.get_run_by_id(parent_id) if parent_id else None
        return inherited_identity_tags(run.run_id, run.tags, parent.tags if parent else None)


def from_http_request(context: SubmitRunContext) -> bool:
    """The webserver's request contexts carry the HTTP request; the daemon's and the CLI's carry none."""
    workspace = context.workspace
    return isinstance(workspace, WorkspaceRequestContext) and workspace.source is not None
