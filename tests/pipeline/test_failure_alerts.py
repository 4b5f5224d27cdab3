"""Run-failure alerts: the Slack-style message (core/alerts.py) and the sensor that posts it
(pipelines/alerts.py), against a real HTTP server on a free local port and real failed runs."""

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest

from core.alerts import ERROR_CHARS, TRUNCATION_NOTE, FailedRun, StepFailure, clip, failure_payload
from pipelines.alerts import (
    ALERT_SENSOR,
    AlertDeliveryError,
    error_summary,
    post_webhook,
    run_failure_alert,
    webhook_host,
)
from pipelines.definitions import build_definitions
from pipelines.profiles import ALERT_WEBHOOK_ENV, Profile
from resources.platform import PlatformSettings
from tests.support.ports import free_ports

# Where a Slack webhook keeps its token; it must never appear in an error message.
SECRET_PATH = "/services/T000/B000/s3cr3tT0ken"
SLACK_SECTION_CHARS = 3000
UI = "https://dagster.example.com"


# --- a webhook on a free local port -----------------------------------------------------------

@dataclass
class Received:
    method: str
    path: str
    content_type: str
    body: dict


@dataclass
class Webhook:
    port: int
    received: list[Received] = field(default_factory=list)
    status: int = 200
    answer: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{SECRET_PATH}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def webhook():
    state = Webhook(port=0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append(Received("POST", self.path, self.headers["Content-Type"], json.loads(raw)))
            self.send_response(state.status)
            for name, value in state.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(state.answer)))
            self.end_headers()
            self.wfile.write(state.answer)

        def do_GET(self):  # a followed redirect would arrive here
            state.received.append(Received("GET", self.path, "", {}))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


# --- a real failed run --------------------------------------------------------------------------

@dg.op
def shard_rows():
    raise ValueError("shard 3 of <digits> has no rows & no header")


@dg.op
def load_ok():
    return 1


@dg.job(partitions_def=dg.StaticPartitionsDefinition(["2024-01", "2024-02"]),
        tags={"platform/model": "digits", "platform/team": "vision", "platform/trigger": "schedule"})
def digits_training():
    load_ok()
    shard_rows()


@dataclass
class FailedRunOnInstance:
    instance: dg.DagsterInstance
    run: dg.DagsterRun
    event: dg.DagsterEvent


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def fail_a_run(instance: dg.DagsterInstance) -> FailedRunOnInstance:
    result = digits_training.execute_in_process(instance=instance, raise_on_error=False, partition_key="2024-02")
    assert not result.success
    return FailedRunOnInstance(instance, instance.get_run_by_id(result.run_id), result.get_run_failure_event())


def settings(tmp_path, webhook_url: str | None, ui_url: str = UI) -> PlatformSettings:
    return PlatformSettings(data_root=str(tmp_path / "platform"), ui_url=ui_url, alert_webhook_url=webhook_url)


def evaluate(failed: FailedRunOnInstance, platform: PlatformSettings):
    """The sensor on ``failed``, the way a test invokes a run-status sensor directly."""
    context = dg.build_run_status_sensor_context(
        sensor_name=ALERT_SENSOR, dagster_event=failed.event, dagster_instance=failed.instance,
        dagster_run=failed.run, resources={"platform": platform})
    return run_failure_alert(context)


def sensor_ticks(instance: dg.DagsterInstance, sensor: dg.SensorDefinition, resources: dict, between):
    """The sensor's first tick (it starts its cursor), ``between()``, and the tick after it."""
    first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources))
    between()
    return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources, cursor=first.cursor))


def section_texts(payload: dict) -> list[str]:
    return [b["text"]["text"] for b in payload["blocks"] if "text" in b]


# --- the message ----------------------------------------------------------------------------------

RUN = FailedRun(
    job_name="digits_training", run_id="3b8c3f4c-f69e-4fb0-97d0-9b1a30841b7f",
    reason='Execution of run for "digits_training" failed. Steps failed: [\'digits__shards\'].',
    steps=(StepFailure("digits__shards", "ValueError: shard 3 has no rows"),
           StepFailure("digits__checkpoint", "RuntimeError: CUDA out of memory")),
    details=(("Model", "digits"), ("Partition", "2024-02")),
)


def test_payload_names_job_run_link_failed_steps_first_error_and_tags():
    payload = failure_payload(RUN, run_url=f"{UI}/runs/{RUN.run_id}")

    assert payload["text"] == ("Run failed: digits_training at step digits__shards: ValueError: shard 3 has no rows "
                               "(run 3b8c3f4c)")
    headline, tags, steps, error = payload["blocks"]
    assert headline["text"]["text"] == (f":rotating_light: *Run failed:* `digits_training` "
                                        f"(run <{UI}/runs/{RUN.run_id}|3b8c3f4c>)")
    assert [f["text"] for f in tags["fields"]] == ["*Model*\ndigits", "*Partition*\n2024-02"]
    assert steps["text"]["text"] == "*Failed steps (2):* `digits__shards`, `digits__checkpoint`"
    assert error["text"]["text"] == "*Error in* `digits__shards`:\n```ValueError: shard 3 has no rows```"
    assert all(b["type"] == "section" for b in payload["blocks"])
    json.dumps(payload)  # what the webhook receives


def test_without_a_ui_url_the_full_run_id_stands_in_for_the_link():
    headline = failure_payload(RUN, run_url=None)["blocks"][0]["text"]["text"]
    assert f"`{RUN.run_id}`" in headline and "<" not in headline


def test_a_run_that_failed_outside_its_steps_shows_what_dagster_says_and_a_retry():
    died = FailedRun(job_name="digits_training", run_id="abcdef0123456789",
                     reason="Run worker process exited unexpectedly", will_retry=True)
    payload = failure_payload(died, run_url=None)

    assert payload["text"] == "Run failed: digits_training: Run worker process exited unexpectedly (run abcdef01)"
    assert "Dagster will retry it automatically." in section_texts(payload)[0]
    assert section_texts(payload)[-1] == "*Failure:*\n```Run worker process exited unexpectedly```"
    assert "Failed step" not in json.dumps(payload)


def test_long_errors_are_cut_within_slack_limits_and_never_inside_an_escaped_character():
    huge = "KeyError: " + "<" * 5000  # every character grows fourfold when escaped
    payload = failure_payload(FailedRun("j", "r" * 36, "x", steps=(StepFailure("s", huge),)), run_url=None)

    error = section_texts(payload)[-1]
    assert all(len(t) <= SLACK_SECTION_CHARS for t in section_texts(payload))
    body = error.split("```")[1]
    assert body.endswith(TRUNCATION_NOTE) and len(body) <= ERROR_CHARS
    assert body.removesuffix(TRUNCATION_NOTE).removeprefix("KeyError: ").replace("&lt;", "") == ""
    assert payload["text"].endswith(f"{TRUNCATION_NOTE} (run rrrrrrrr)")
    assert clip("short & sweet", 100) == "short &amp; sweet"


def test_markup_in_run_values_is_escaped_so_it_cannot_ping_or_link():
    hostile = FailedRun(job_name="j", run_id="r1", reason="x",
                        steps=(StepFailure("s", "Error: <!channel> see <http://evil.example|here> ```end```"),),
                        details=(("Model", "<@U123>"),))
    text = json.dumps(failure_payload(hostile, run_url=None))

    assert "<!channel>" not in text and "<http://evil" not in text and "<@U123>" not in text
    assert "&lt;!channel&gt;" in text and "'''end'''" in text


def test_many_failed_steps_are_named_up_to_ten_and_counted_after():
    steps = tuple(StepFailure(f"step_{i}", "E") for i in range(13))
    line = section_texts(failure_payload(FailedRun("j", "r", "x", steps=steps), run_url=None))[1]
    assert line.startswith("*Failed steps (13):* `step_0`") and "`step_9` and 3 more" in line
    assert "step_10" not in line


def test_clip_refuses_a_limit_too_small_for_its_note():
    with pytest.raises(ValueError, match="leaves no room"):
        clip("error", 5)


# --- reading the run and reaching the webhook ------------------------------------------------------

def test_error_summary_names_the_exception_the_op_raised(instance):
    failed = fail_a_run(instance)
    (step,) = [e for e in instance.all_logs(failed.run.run_id) if e.dagster_event and e.dagster_event.is_step_failure]
    assert error_summary(step.dagster_event.event_specific_data.error) == (
        "ValueError: shard 3 of <digits> has no rows & no header")


def test_a_webhook_url_that_is_not_http_is_refused_without_showing_it():
    with pytest.raises(AlertDeliveryError, match=f"not an http\\(s\\) URL.*set {ALERT_WEBHOOK_ENV}") as err:
        webhook_host("hooks.slack.com/services/T000/B000/s3cr3tT0ken")
    assert "s3cr3tT0ken" not in str(err.value)
    assert webhook_host("https://user:pw@hooks.example.com:8443/x") == "hooks.example.com:8443"


def test_sensor_posts_the_failed_run_to_the_webhook(webhook, instance, tmp_path):
    failed = fail_a_run(instance)
    result = evaluate(failed, settings(tmp_path, webhook.url))

    assert result is None  # posted; nothing to skip
    (request,) = webhook.received
    assert (request.method, request.path) == ("POST", SECRET_PATH)
    assert request.content_type.startswith("application/json")
    body = request.body
    run_id = failed.run.run_id
    assert body["text"] == (f"Run failed: digits_training at step shard_rows: ValueError: shard 3 of &lt;digits&gt; "
                            f"has no rows &amp; no header (run {run_id[:8]})")
    texts = section_texts(body)
    assert f"<{UI}/runs/{run_id}|{run_id[:8]}>" in texts[0]
    assert "*Failed step:* `shard_rows`" in texts
    assert texts[-1] == ("*Error in* `shard_rows`:\n"
                         "```ValueError: shard 3 of &lt;digits&gt; has no rows &amp; no header```")
    fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for b in body["blocks"] for f in b.get("fields", [])}
    assert fields == {"*Model*": "digits", "*Team*": "vision", "*Trigger*": "schedule", "*Partition*": "2024-02",
                      "*Failure reason*": "STEP_FAILURE"}


def test_an_error_answer_raises_naming_host_and_status_but_never_the_url(webhook, instance, tmp_path):
    failed = fail_a_run(instance)
    webhook.status, webhook.answer = 500, f"no_service for {SECRET_PATH}".encode()

    with pytest.raises(AlertDeliveryError, match=f"alert webhook at {webhook.host} answered HTTP 500") as err:
        evaluate(failed, settings(tmp_path, webhook.url))
    assert "no_service for <webhook path>" in str(err.value)
    assert "s3cr3tT0ken" not in str(err.value)
    assert len(webhook.received) == 1


def test_a_redirect_is_reported_not_followed(webhook):
    webhook.status, webhook.headers = 302, {"Location": f"http://127.0.0.1:{webhook.port}/elsewhere"}
    with pytest.raises(AlertDeliveryError, match=f"{webhook.host} answered HTTP 302"):
        post_webhook(webhook.url, {"text": "t"})
    assert [r.method for r in webhook.received] == ["POST"]


def test_an_unreachable_webhook_raises_naming_its_host():
    (port,) = free_ports(1)  # nothing listens there
    with pytest.raises(AlertDeliveryError, match=f"alert webhook at 127.0.0.1:{port} could not be reached") as err:
        post_webhook(f"http://127.0.0.1:{port}{SECRET_PATH}", {"text": "t"})
    assert "s3cr3tT0ken" not in str(err.value)


def test_a_webhook_that_never_answers_times_out():
    with socket.socket() as silent:  # accepts connections (backlog), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        with pytest.raises(AlertDeliveryError, match=r"could not be reached \(timeout 0.5 s\)"):
            post_webhook(f"http://127.0.0.1:{port}{SECRET_PATH}", {"text": "t"}, timeout_s=0.5)


def test_a_failed_delivery_marks_the_sensor_tick_failed(webhook, instance, tmp_path):
    webhook.status = 503
    tick = sensor_ticks(instance, run_failure_alert, {"platform": settings(tmp_path, webhook.url)},
                        between=lambda: fail_a_run(instance))

    (reaction,) = tick.dagster_run_reactions
    assert reaction.error is not None
    assert f"alert webhook at {webhook.host} answered HTTP 503" in reaction.error.to_string()
    assert "s3cr3tT0ken" not in reaction.error.to_string()


def test_without_a_webhook_nothing_is_sent(webhook, instance, tmp_path):
    failed = fail_a_run(instance)
    skipped = evaluate(failed, settings(tmp_path, None))
    assert isinstance(skipped, dg.SkipReason)
    assert "no webhook configured" in skipped.skip_message and ALERT_WEBHOOK_ENV in skipped.skip_message

    tick = sensor_ticks(instance, run_failure_alert, {"platform": settings(tmp_path, None)},
                        between=lambda: fail_a_run(instance))
    assert "no webhook configured" in tick.skip_message
    assert webhook.received == []


def test_the_webhook_setting_reaches_the_registered_sensor_from_the_environment(webhook, instance, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("PLATFORM_PROFILE", raising=False)
    monkeypatch.delenv(ALERT_WEBHOOK_ENV, raising=False)
    assert Profile.from_environment().resources()["platform"].alert_webhook_url is None

    monkeypatch.setenv(ALERT_WEBHOOK_ENV, webhook.url)
    profile = Profile.from_environment()
    platform = profile.resources()["platform"]
    assert platform.alert_webhook_url == ALERT_WEBHOOK_ENV  # an EnvVar: the UI shows its name, not the URL
    defs = build_definitions(profile, [], with_yaml=False)
    sensor = defs.resolve_sensor_def(ALERT_SENSOR)
    # the top-level resources the sensor asks for, as the code server hands them to it
    resources = {k: v for k, v in defs.get_repository_def().get_top_level_resources().items()
                 if k in sensor.required_resource_keys}

    sensor_ticks(instance, sensor, resources, between=lambda: fail_a_run(instance))

    (request,) = webhook.received
    assert request.path == SECRET_PATH and request.body["text"].startswith("Run failed: digits_training")


def test_an_alert_says_when_dagster_will_retry_the_run(webhook, tmp_path):
    with dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True, "max_retries": 1}}) as retrying:
        failed = fail_a_run(retrying)
        assert failed.run.tags.get("dagster/will_retry") == "true"  # set by Dagster, read by the sensor
        evaluate(failed, settings(tmp_path, webhook.url))

    (request,) = webhook.received
    assert "Dagster will retry it automatically." in section_texts(request.body)[0]
