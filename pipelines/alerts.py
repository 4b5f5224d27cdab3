"""Failure alerts: when a run of this code location fails, ``run_failure_alert`` POSTs a
Slack-style message (core/alerts.py) to the webhook in ``PlatformSettings.alert_webhook_url``.

The webhook is set through ``MODEL_FACTORY_ALERT_WEBHOOK_URL`` (pipelines/profiles.py; on
Kubernetes from an optional Secret, helm/dagster-values.yaml). The sensor is always registered
and running: with no webhook it sends nothing and skips each failed run with a reason that says
how to turn alerts on, so the UI shows why no alert came and setting the webhook needs no code
change.

A webhook that answers with an error, redirects, cannot be reached or times out makes the
sensor raise: Dagster records the error on that tick (the sensor's tick history shows it failed).
Dagster's run-status sensors still move past that run, so the failed tick is the record of the
lost alert. The webhook URL carries a token (Slack's does), so messages name only its host.
"""

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
from dagster_shared.error import SerializableErrorInfo

from core.alerts import FailedRun, StepFailure, failure_payload
from pipelines.automation import MODEL_TAG, TEAM_TAG, TRIGGER_TAG
from pipelines.profiles import ALERT_WEBHOOK_ENV
from resources.platform import PlatformSettings

ALERT_SENSOR = "run_failure_alert"
WEBHOOK_TIMEOUT_S = 10.0  # a sensor evaluation has 60 s in all; a hung webhook must not use them
# Run tags worth a glance in the alert, with their labels, in this order.
ALERT_TAGS = (
    (MODEL_TAG, "Model"),
    (TEAM_TAG, "Team"),
    (TRIGGER_TAG, "Trigger"),
    ("dagster/partition", "Partition"),
    ("dagster/schedule_name", "Schedule"),
    ("dagster/sensor_name", "Sensor"),
    ("dagster/backfill", "Backfill"),
    ("dagster/retry_number", "Retry"),
    ("dagster/failure_reason", "Failure reason"),
)
WILL_RETRY_TAG = "dagster/will_retry"  # set by Dagster on a failed run when run retries will retry it
# Dagster wraps what an op raised in this; the alert names the exception itself.
STEP_WRAPPER_ERROR = "DagsterExecutionStepExecutionError"
BODY_CHARS = 300  # of a webhook's error answer, in the raised message


class AlertDeliveryError(Exception):
    """The webhook did not take the alert."""


def error_summary(error: SerializableErrorInfo) -> str:
    """The message of a Dagster error, e.g. "ValueError: shard 3 has no
    rows", looking through Dagster's step wrapper to the exception the code raised."""
    while error.cls_name == STEP_WRAPPER_ERROR and error.cause is not None:
        error = error.cause
    return error.message.strip()


def run_details(tags: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((label, tags[tag]) for tag, label in ALERT_TAGS if tags.get(tag))


def failed_run(context: dg.RunFailureSensorContext) -> FailedRun:
    """What the alert says about the run ``context`` reports, read from its events and tags."""
    run, event = context.dagster_run, context.failure_event
    steps: dict[str, StepFailure] = {}
    for step_event in context.get_step_failure_events():
        if step_event.step_key and step_event.step_key not in steps:
            steps[step_event.step_key] = StepFailure(step_event.step_key,
                                                     error_summary(step_event.event_specific_data.error))
    reason = event.message or f"run {run.run_id} failed"
    data = event.event_specific_data
    if data is not None and getattr(data, "error", None) is not None:
        reason = f"{reason}\n{error_summary(data.error)}"
    return FailedRun(job_name=run.job_name, run_id=run.run_id, reason=reason, steps=tuple(steps.values()),
                     details=run_details(run.tags), will_retry=run.tags.get(WILL_RETRY_TAG) == "true")


def webhook_host(url: str) -> str:
    """The host (and port) of ``url``, the only part of it messages show."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertDeliveryError(
            f"the alert webhook URL is not an http(s) URL (scheme {parts.scheme or 'missing'!r}"
            f"{'' if parts.hostname else ', no host'}); set {ALERT_WEBHOOK_ENV} to the webhook's full URL, "
            "e.g. https://hooks.slack.com/services/...")
    return parts.netloc.rpartition("@")[2]  # never credentials in user:password@host


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    # Following a redirect would resend the alert elsewhere, or as a GET without it; the 3xx is
    # reported as the webhook's answer instead.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def post_webhook(url: str, payload: Mapping[str, Any], timeout_s: float = WEBHOOK_TIMEOUT_S) -> str:
    """POST ``payload`` as JSON to ``url``; the webhook's host once it answered 2xx, else
    AlertDeliveryError naming the host and what went wrong."""
    host = webhook_host(url)
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json; charset=utf-8"})
    try:
        # urllib raises HTTPError for every answer outside 2xx.
        with urllib.request.build_opener(_RefuseRedirects).open(request, timeout=timeout_s):
            return host
    except urllib.error.HTTPError as err:
        body = redacted(err.read(BODY_CHARS).decode("utf-8", "replace"), url).strip()
        raise AlertDeliveryError(f"alert webhook at {host} answered HTTP {err.code} {err.reason}"
                                 + (f": {body}" if body else "")) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        why = err.reason if isinstance(err, urllib.error.URLError) else f"{type(err).__name__}: {err}"
        raise AlertDeliveryError(f"alert webhook at {host} could not be reached (timeout {timeout_s:g} s): "
                                 f"{redacted(str(why), url)}") from None


def redacted(text: str, url: str) -> str:
    """``text`` without ``url`` or its path, where the token of a Slack webhook sits."""
    parts = urlsplit(url)
    secret_part = parts.path + (f"?{parts.query}" if parts.query else "")
    text = text.replace(url, "<webhook URL>")
    return text.replace(secret_part, "<webhook path>") if len(secret_part) > 1 else text


@dg.run_failure_sensor(
    name=ALERT_SENSOR, default_status=dg.DefaultSensorStatus.RUNNING,
    description=f"POST a Slack-style message to the alert webhook ({ALERT_WEBHOOK_ENV}) when any run of this "
                "code location fails; skips, sending nothing, while no webhook is configured.")
def run_failure_alert(context: dg.RunFailureSensorContext, platform: PlatformSettings):
    run = context.dagster_run
    if not platform.alert_webhook_url:
        return dg.SkipReason(f"run {run.run_id} of {run.job_name} failed; no alert sent: no webhook configured "
                             f"(set {ALERT_WEBHOOK_ENV} to turn alerts on)")
    run_url = platform.run_url(run.run_id) if platform.ui_url.strip() else None
    host = post_webhook(platform.alert_webhook_url, failure_payload(failed_run(context), run_url))
    context.log.info(f"alert for failed run {run.run_id} of {run.job_name} sent to {host}")
    return None


def alert_definitions() -> dg.Definitions:
    return dg.Definitions(sensors=[run_failure_alert])
