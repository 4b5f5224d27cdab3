"""Dagster Pipes reporter for rank 0. The only module besides the entry point that imports
``dagster_pipes``; used only when the process was launched by Dagster (DAGSTER_PIPES_CONTEXT set).

Every message it sends gets a sequence number (``seq``, from 1 in each process). With
``TRAINING_RUNTIME_PIPES_LEDGER`` naming a folder, it also appends one line per message, once
the message is written, to ``<folder>/<run id>-<pid>.jsonl``: its number, when it was written,
its method, kind and step, and the sha256 of a log line's text. A check can then count what reached the run's event log
(tests/reliability/soak/runs.py): a reader thread that dies mid-run loses every later
message while the run may still succeed, and only a count shows that. The ledger never carries
a message's content, only what identifies it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from dagster_pipes import PipesContext, open_dagster_pipes

from training_runtime.observe.attempts import RETRYABLE

log = logging.getLogger("training_runtime")

LEDGER_ENV = "TRAINING_RUNTIME_PIPES_LEDGER"


def ledger_entry(seq: int, method: str, *, text: str | None = None, payload: Mapping[str, Any] | None = None,
                 restart: int = 0) -> dict[str, Any]:
    """What the ledger records of message ``seq``: a log line by its text's sha256, a custom
    message by its kind and step (and a detection by its detector)."""
    entry: dict[str, Any] = {"seq": seq, "method": method, "restart": restart, "unix": round(time.time(), 3)}
    if text is not None:
        entry["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    if payload is not None:
        entry["kind"] = payload.get("kind")
        step = payload.get("step")
        entry["step"] = step if isinstance(step, int) and not isinstance(step, bool) else None
        if payload.get("kind") == "detection":
            entry["detector"] = payload.get("detector")
    return entry


class PipesReporter:
    """Progress lines go to ``pipes.log.info`` (and the local log), telemetry and the final figures
    to ``report_custom_message``. As a context manager it closes the Pipes connection, passing an
    exception that ends the run on to Dagster. One message at a time: the hang watchdog reports
    from its own thread, and two writers must not interleave inside one message."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.pipes: PipesContext = open_dagster_pipes()
        self.seq = 0  # messages sent so far
        self._restart = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self._lock = threading.Lock()
        self.failure_recorded = False  # set by ``recorded``: the orchestrator tells the failure from the records
        # set by ``failed`` (or ``restarting``): a new attempt may fix this rank's failure, so the
        # session stays open for it (``__exit__``)
        self.retryable_failure = False
        folder = environ.get(LEDGER_ENV)
        self.ledger: Path | None = None
        if folder:
            self.ledger = Path(folder) / f"{self.pipes.run_id}-{os.getpid()}.jsonl"
            self.ledger.parent.mkdir(parents=True, exist_ok=True)

    def info(self, message: str) -> None:
        log.info(message)
        with self._lock:
            self.pipes.log.info(message)
            self._sent("log", text=message)

    def custom(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.pipes.report_custom_message(payload)
            self._sent("custom", payload=payload)

    def _sent(self, method: str, **what: Any) -> None:
        """Count a message that was written; the ledger line follows the message, so a process
        killed between the two leaves a message the ledger does not claim, never the reverse."""
        self.seq += 1
        if self.ledger is not None:
            line = json.dumps(ledger_entry(self.seq, method, restart=self._restart, **what), sort_keys=True)
            with open(self.ledger, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def failed(self, kind: str) -> None:
        """This rank failed, of ``kind`` (observe/attempts.py's RETRYABLE or DETERMINISTIC), told
        before the failure is written anywhere, so that a record the failing volume refuses still
        leaves the session open for an attempt that may follow (``__exit__``)."""
        self.retryable_failure = kind == RETRYABLE

    def recorded(self) -> None:
        """This rank's failure is in its attempt's records (train/failures.py): the orchestrator
        reads them and fails the step in the runtime's words, so the "closed" message need not
        carry the exception too (Dagster would show it, with this rank's stack trace, as a second
        copy of the failure ahead of the step's)."""
        self.failure_recorded = True

    def restarting(self, message: str) -> None:
        """This attempt of rank 0 failed and torchrun restarts the workers (train/failures.py): say
        so in the run's log. The session stays open, as after any failure a new attempt may fix:
        the restarted rank 0 opens the same message channel again, and its "closed", at the real
        end, closes the session once."""
        with self._lock:
            self.pipes.log.warning(message)
            self._sent("log", text=message)
        self.retryable_failure = True

    def __enter__(self) -> PipesReporter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and self.retryable_failure:
            # No "closed": a failure a retry may fix can be followed, in this same session, by an
            # attempt rank 0 cannot always foresee: torchrun's restart (``restarting``), an elastic
            # gang's re-forming (which torchrun does not count), or a replacement pod the Job
            # controller starts. A "closed" here made Dagster warn about every message of that
            # attempt ("unexpected message received after closed"). Nothing is lost: the channels
            # the launchers use (a file appended to per message, a pod's stdout) hold every
            # message already written, and the launcher's reader closes a session that ends with
            # no attempt left (resources/launch/live_telemetry.py, ``ForwardsTrainingMessages``).
            return
        if exc is not None and self.failure_recorded:
            self.pipes.close()  # the traceback is still printed to stderr, the rank's log
            return
        self.pipes.__exit__(exc_type, exc, tb)

