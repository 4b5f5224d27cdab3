"""Two of the soak's invariants read from the instance: how each run ended, and whether every
Pipes message a training's rank 0 wrote reached the run's event log.

**How runs end.** A run ends in success; or in a *named* failure, one whose error says what went
wrong in the platform's own words (``NAMED_CAUSES``), never a bare traceback; or in a failure
whose automatic retry (run retries, ``dagster/parent_run_id``) ended in success or in a named
failure (a run whose worker was killed has no cause of its own). A run still
queued or running after the soak's drain is stuck.

**Pipes messages.** Rank 0's reporter writes a ledger line per message it wrote
(training_runtime/observe/pipes.py). Each has a per-message trace in the event log: a log line
is a log entry with the same text (matched by sha256), a "telemetry" message an observation of
the checkpoint asset at its step (resources/launch/live_telemetry.py), a "detection" a
"training health: <detector> at step <step>" line. "validation" and "final" messages have none
(the session's handler keeps them); they count as arrived when a later message of the same
process arrived, since the reader reads the file in order and logs every line it skips, and as
unverifiable when none did (a process killed right after one). A
message written after its run's worker was killed cannot arrive (its reader died with it): a
ledger line from within ``RECEIVER_MARGIN_S`` before such a kill, or after it, is not required.
A long training's telemetry is thinned on purpose (resources/launch/observation_thinning.py: all
of the first 50 messages, then every 2nd, 4th, ...; the last one skipped is observed at the end):
the count replays that thinning over the run's telemetry lines in the order they were written,
and a line it skips is "thinned", not required. That is the reader's order when a run has one
reader session, as every soak training does, or its sessions' telemetry stays within the first
50 (the wine sweep's trials: a few messages each).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from resources.launch.observation_thinning import ObservationThinning

FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
# (cause, pattern): the platform's own words for a failure, by the code that says them.
NAMED_CAUSES = (
    ("non-finite loss", re.compile(r"non-finite (loss|gradient)")),
    ("training failed, in the runtime's words", re.compile(r"training '[\w-]+' failed")),
    ("store unavailable", re.compile(r"kept failing after|store .* (unavailable|answered)|lakeFS", re.I)),
    ("S3 unavailable", re.compile(r"\bS3\b|s3://|EndpointConnectionError|Could not connect to the endpoint")),
    ("disk full", re.compile(r"File too large|No space left on device|Errno 27|Errno 28")),
    ("run worker died", re.compile(r"run worker process \d+ is gone")),
    ("quality gate", re.compile(r"quality gate", re.I)),
    ("data checks", re.compile(r"Great Expectations|expectation", re.I)),
    # A team's run started before the dataset it trains on had a published version.
    ("dataset not published yet", re.compile(r"dataset '[\w-]+' has no published versions")),
)
TELEMETRY = re.compile(r"^training telemetry at step (\S+)$")
DETECTION = re.compile(r"^training health: (\S+) at step (\S+?)[,:]")
RECEIVER_MARGIN_S = 2.0


def failure_text(instance: dg.DagsterInstance, run_id: str) -> str:
    """Every step failure's message with its causes, and the run failure's message."""
    parts = []
    for record in instance.get_records_for_run(run_id, of_type={
            dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE}).records:
        entry = record.event_log_entry
        event = entry.dagster_event
        parts.append(entry.message or "")
        data = event.event_specific_data if event is not None else None
        error = getattr(data, "error", None)
        while error is not None:
            parts.append(error.message.strip())
            error = error.cause
        user = getattr(data, "user_failure_data", None)
        if user is not None and user.description:
            parts.append(user.description)
    return "\n".join(p for p in parts if p)


def named_causes(text: str) -> list[str]:
    return [cause for cause, pattern in NAMED_CAUSES if pattern.search(text)]


@dataclass
class RunOutcome:
    run_id: str
    model: str | None
    status: str
    parent: str | None
    root: str
    retried_by: str | None = None
    causes: list[str] = field(default_factory=list)
    message: str = ""  # the failure's first lines, for the report
    verdict: str = ""  # "success", "named failure", "retry succeeded", or what is wrong

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def run_outcomes(instance: dg.DagsterInstance) -> dict[str, RunOutcome]:
    runs = instance.get_runs()
    children = {r.tags["dagster/parent_run_id"]: r.run_id for r in runs if "dagster/parent_run_id" in r.tags}
    by_id = {r.run_id: r for r in runs}
    outcomes = {}
    for run in runs:
        out = RunOutcome(run.run_id, run.tags.get("platform/model"), run.status.value,
                         run.tags.get("dagster/parent_run_id"), run.tags.get("dagster/root_run_id", run.run_id),
                         retried_by=children.get(run.run_id))
        if run.status == dg.DagsterRunStatus.FAILURE:
            text = failure_text(instance, run.run_id)
            out.causes, out.message = named_causes(text), text[:600]
        outcomes[run.run_id] = out
    for out in outcomes.values():
        out.verdict = _verdict(out, outcomes, by_id)
    return outcomes


def _verdict(out: RunOutcome, outcomes: dict[str, RunOutcome], runs: dict) -> str:
    if out.status == "SUCCESS":
        return "success"
    if out.status in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"):
        return "in flight"
    if out.status == "CANCELED":
        return "canceled (nothing in the soak cancels runs)"
    seen, last, child = {out.run_id}, out, out.retried_by
    while child is not None and child not in seen:  # a retry of a retry ...
        seen.add(child)
        if outcomes[child].status == "SUCCESS":
            return "retry succeeded"
        if outcomes[child].status not in ("FAILURE",):
            return "retry in flight"
        last, child = outcomes[child], outcomes[child].retried_by
    if out.causes:
        return "named failure"
    # A killed run worker's run is marked failed from outside with no cause of its own; what
    # the user is told is its last retry's failure (the first 30-minute soak judged such a
    # chain, ending in "No space left on device", by the killed run alone).
    if last is not out and last.causes:
        return "retry ended in a named failure"
    return "unnamed failure"


OK_VERDICTS = ("success", "named failure", "retry succeeded", "retry ended in a named failure")


# --- Pipes messages -----------------------------------------------------------------------------
def read_ledgers(ledger_dir: Path, run_id: str) -> dict[str, list[dict]]:
    """Ledger file name -> its lines, for every rank-0 process of ``run_id``. A line cut by a
    kill of its writer (the last one, without a newline) is not a message the ledger claims."""
    found = {}
    for path in sorted(ledger_dir.glob(f"{run_id}-*.jsonl")):
        lines = []
        for line in path.read_text().split("\n"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the empty tail, or a line cut by a kill
        found[path.name] = lines
    return found


@dataclass
class Arrived:
    logs: Counter  # sha256 of each log entry's text
    telemetry: Counter  # step of each telemetry observation
    detections: Counter  # (detector, step)
    skipped_lines: list[str]  # the reader's "is skipped" warnings
    unshown: int  # "could not show a training message live" warnings


def arrived(instance: dg.DagsterInstance, run_id: str) -> Arrived:
    logs, telemetry, detections, skipped, unshown = Counter(), Counter(), Counter(), [], 0
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            text = entry.user_message or ""
            logs[hashlib.sha256(text.encode()).hexdigest()] += 1
            if text.startswith("[pipes]") and "is skipped" in text:
                skipped.append(text[:300])
            if text.startswith("could not show a training message live"):
                unshown += 1
            if m := DETECTION.match(text):
                detections[(m.group(1), m.group(2))] += 1
        elif event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
            description = event.event_specific_data.asset_observation.description or ""
            if m := TELEMETRY.match(description):
                telemetry[m.group(1)] += 1
    return Arrived(logs, telemetry, detections, skipped, unshown)


@dataclass
class MessageCount:
    run_id: str
    written: int = 0  # ledger lines
    required: int = 0  # of those, the ones that must have arrived
    checked: int = 0  # required ones with a per-message trace, matched one by one
    covered: int = 0  # validation/final ones followed by a message that arrived
    unverifiable: int = 0  # validation/final ones after the process's last traced message
    thinned: int = 0  # telemetry the reader skipped on purpose (observation thinning)
    missing: list[dict] = field(default_factory=list)
    skipped_lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def count_messages(instance: dg.DagsterInstance, ledger_dir: Path, run_id: str,
                   receiver_killed_at: float | None = None) -> MessageCount:
    """Match every ledger line of ``run_id`` against its event log (the module's text)."""
    return match_messages(run_id, arrived(instance, run_id), read_ledgers(ledger_dir, run_id), receiver_killed_at)


def match_messages(run_id: str, got: Arrived, ledgers: dict[str, list[dict]],
                   receiver_killed_at: float | None = None) -> MessageCount:
    result = MessageCount(run_id, skipped_lines=got.skipped_lines)
    thinned = thinned_telemetry(ledgers)
    result.thinned = len(thinned)
    for name, lines in ledgers.items():
        result.written += len(lines)
        required = [e for e in lines if (receiver_killed_at is None or e["unix"] < receiver_killed_at - RECEIVER_MARGIN_S)
                    and (name, e["seq"]) not in thinned]
        result.required += len(required)
        last_traced = 0
        for entry in required:
            trace = _take(got, entry)
            if trace is None:
                continue  # validation / final: judged by what came after them
            result.checked += 1
            if trace:
                last_traced = entry["seq"]
            else:
                result.missing.append(entry)
        untraced = [e for e in required if _take_kind(e) is None]
        result.covered += sum(e["seq"] < last_traced for e in untraced)
        result.unverifiable += sum(e["seq"] > last_traced for e in untraced)
    return result


def thinned_telemetry(ledgers: dict[str, list[dict]]) -> set[tuple[str, int]]:
    """(ledger, seq) of the telemetry lines the reader's thinning skips: ObservationThinning replayed
    over the run's telemetry in the order it was written; the last one is observed at the end."""
    telemetry = sorted(((e["unix"], name, e["seq"]) for name, lines in ledgers.items() for e in lines
                        if _take_kind(e) == "telemetry"))
    thinning = ObservationThinning()
    skipped = {(name, seq) for _, name, seq in telemetry if not thinning.keep()}
    if telemetry:
        skipped.discard(telemetry[-1][1:])
    return skipped


def _take_kind(entry: dict) -> str | None:
    if entry["method"] == "log":
        return "log"
    return entry.get("kind") if entry.get("kind") in ("telemetry", "detection") else None


def _take(got: Arrived, entry: dict) -> bool | None:
    """Consume the event-log trace of one ledger line: True found, False missing, None when the
    message kind leaves no trace of its own."""
    kind = _take_kind(entry)
    if kind is None:
        return None
    bag, key = {"log": (got.logs, entry.get("sha256")),
                "telemetry": (got.telemetry, str(entry.get("step"))),
                "detection": (got.detections, (entry.get("detector"), str(entry.get("step"))))}[kind]
    if bag[key] > 0:
        bag[key] -= 1
        return True
    return False
