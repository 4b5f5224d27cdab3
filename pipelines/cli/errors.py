"""The CLI's own errors; ``main`` turns them into a one-line message and an exit status. And how a
failed run the CLI executed is told: its cause once, at the end, with no stack trace on the
console (``failure_lines``, ``cli_loggers``).

Stack traces and every event stay in the run's event log, which the UI shows.
"""

import logging


class UsageError(ValueError):
    """Arguments that parse but make no sense together."""


class ReproductionError(RuntimeError):
    """The reproduction's training run failed."""


def failure_lines(result) -> list[str]:
    """What a failed run says to the user: each failed step's cause once, as ``FAILED <step>:
    <cause>``. A ``dagster.Failure``'s description (the training's own words) is the cause, not its
    class name and text; the run's failure event, which repeats its first step's, is left out, and
    a run that failed outside any step says why in one line. ``result``: an ExecuteInProcessResult."""
    lines: list[str] = []
    for event in result.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        user = data.user_failure_data
        cause = (user.description if user is not None and user.description else data.error.message).strip()
        line = f"FAILED {event.step_key}: {cause}"
        if line not in lines:
            lines.append(line)
    if not lines:
        lines = [f"FAILED run {result.run_id}: {e.event_specific_data.error.message.strip()}"
                 for e in result.all_events if e.is_failure and e.event_specific_data.error is not None][:1]
    return lines or [f"FAILED run {result.run_id}: no step recorded why; see its event log"]


class _FailureWithoutTrace(logging.Filter):
    """On the CLI's console, an event that carries an error is its one-line headline: a step's or
    run's failure says its cause once, by ``failure_lines`` at the end, and the stack traces stay
    in the run's event log (the UI shows them). Any other (a retry, an engine event) adds its
    error's first line, since the step goes on."""

    def filter(self, record: logging.LogRecord) -> bool:
        # A @logger's record carries the event itself (Dagster passes its ``extra`` on).
        event = getattr(record, "dagster_event", None) or (getattr(record, "dagster_meta", None) or {}).get(
            "dagster_event")
        error = getattr(event.event_specific_data, "error", None) if event is not None else None
        if error is None:
            return True
        headline = str(record.msg).split("\n\n", 1)[0]
        if not (event.is_step_failure or event.is_run_failure):  # a retry, an engine event: the step goes on
            headline += f" ({(error.message.strip().splitlines() or [''])[0]})"
        record.msg, record.args = headline, ()
        return True


def cli_loggers() -> dict:
    """Logger definitions for a run the CLI executes in process: Dagster's own console logger, its
    failure events without their stack traces (``_FailureWithoutTrace``)."""
    import dagster as dg
    from dagster._loggers import colored_console_logger

    @dg.logger(colored_console_logger.config_schema, description=colored_console_logger.description)
    def console(init_context):
        logger = colored_console_logger.logger_fn(init_context)
        for handler in logger.handlers:
            handler.addFilter(_FailureWithoutTrace())
        return logger

    return {"console": console}


def execute_for_cli(job, *, run_config: dict | None = None, **kwargs):
    """``job.execute_in_process(run_config=..., **kwargs)`` with the CLI's console logger
    (``cli_loggers``; Dagster starts a job's own loggers only when the run config names them),
    at the level Dagster's default console logger has (DEBUG)."""
    config = {**(run_config or {}), "loggers": {"console": {"config": {"log_level": "DEBUG"}}}}
    return job.with_logger_defs(cli_loggers()).execute_in_process(run_config=config, **kwargs)
