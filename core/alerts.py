"""The message a failed run's alert carries: Slack incoming-webhook JSON, ``text`` for the
notification and ``blocks`` for the message, built from plain values (pipelines/alerts.py reads
them from Dagster and posts the result).

Slack reads ``&``, ``<`` and ``>`` as markup, so every value from a run is escaped; long errors
are cut so the message stays within Slack's limits (3,000 characters per section, 2,000 per field,
10 fields per section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ERROR_CHARS = 1500  # the first error, in full up to this; the run's logs have the rest
HEADLINE_ERROR_CHARS = 200  # the one-line error in the notification text
FIELD_CHARS = 200  # a tag value
STEPS_NAMED = 10  # failing steps named in the message; more are counted
MAX_FIELDS = 10  # Slack's limit per section
TRUNCATION_NOTE = " … [cut; the run in Dagster has all of it]"


@dataclass(frozen=True)
class StepFailure:
    step_key: str
    error: str  # the exception the step raised, e.g. "ValueError: shard 3 has no rows"


@dataclass(frozen=True)
class FailedRun:
    job_name: str
    run_id: str
    # What Dagster says about the run's failure; the message shows it when no step failed (a run
    # worker that died, a run that never started).
    reason: str
    steps: tuple[StepFailure, ...] = ()
    details: tuple[tuple[str, str], ...] = ()  # (label, value): model, team, partition, ...
    will_retry: bool = False


def escape(text: str) -> str:
    """Slack's three control characters as the entities it expects."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clip(text: str, limit: int) -> str:
    """``text`` escaped for Slack, in at most ``limit`` characters: cut (never inside an entity)
    with a note saying so when it does not fit. Slack's limits count the escaped text."""
    if limit <= len(TRUNCATION_NOTE):
        raise ValueError(f"clip: a limit of {limit} characters leaves no room for the text; use more "
                         f"than {len(TRUNCATION_NOTE)}")
    escaped = escape(text)
    if len(escaped) <= limit:
        return escaped
    kept, used = [], 0
    for char in text:
        piece = escape(char)
        if used + len(piece) > limit - len(TRUNCATION_NOTE):
            break
        kept.append(piece)
        used += len(piece)
    return "".join(kept).rstrip() + TRUNCATION_NOTE


def code_block(text: str, limit: int) -> str:
    # Three backticks inside the error would close the block early.
    return "```" + clip(text.replace("```", "'''"), limit) + "```"


def one_line(text: str) -> str:
    return " ".join(text.split())


def failure_payload(run: FailedRun, run_url: str | None) -> dict[str, Any]:
    """Slack incoming-webhook JSON for ``run``; ``run_url`` (the run's page in the Dagster UI)
    is linked when given."""
    short_id = run.run_id[:8]
    job = escape(run.job_name)
    run_ref = f"<{run_url}|{short_id}>" if run_url else f"`{escape(run.run_id)}`"
    headline = f":rotating_light: *Run failed:* `{job}` (run {run_ref})"
    if run.will_retry:
        headline += "\nDagster will retry it automatically."
    blocks: list[dict[str, Any]] = [_section(headline)]

    if run.details:
        blocks.append({"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*{escape(label)}*\n{clip(value, FIELD_CHARS)}"}
            for label, value in run.details[:MAX_FIELDS]]})

    if run.steps:
        first = run.steps[0]
        blocks.append(_section(_steps_line(run.steps)))
        blocks.append(_section(f"*Error in* `{escape(first.step_key)}`:\n"
                               f"{code_block(first.error, ERROR_CHARS)}"))
        where, error = f" at step {first.step_key}", first.error
    else:
        blocks.append(_section(f"*Failure:*\n{code_block(run.reason, ERROR_CHARS)}"))
        where, error = "", run.reason

    text = (f"Run failed: {job}{escape(where)}: {clip(one_line(error), HEADLINE_ERROR_CHARS)} "
            f"(run {short_id})")
    return {"text": text, "blocks": blocks}


def _steps_line(steps: tuple[StepFailure, ...]) -> str:
    named = ", ".join(f"`{escape(s.step_key)}`" for s in steps[:STEPS_NAMED])
    more = f" and {len(steps) - STEPS_NAMED} more" if len(steps) > STEPS_NAMED else ""
    label = "Failed step" if len(steps) == 1 else f"Failed steps ({len(steps)})"
    return f"*{label}:* {named}{more}"


def _section(mrkdwn: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn}}
