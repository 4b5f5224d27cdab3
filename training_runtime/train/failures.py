"""What a retry can fix: every failure of a rank is classified and recorded, and one that a new
attempt would repeat ends the launch at once.

- Retryable (a restart may succeed): a killed or preempted worker, a lost peer or node (the
  collective errors its survivors raise), a hang (the watchdog's exit), a store or volume that
  went away (``OSError``, ``DataError``), anything unknown.
- Deterministic (a restart repeats it): a non-finite stop, a config error (an image built from
  other code included), user code that cannot be imported or called (``ImportError``, a wrong
  signature, the training function's broken contract), a programming error (``TypeError``,
  ``KeyError``, ``ValueError``, ...).

A deterministic failure is written to the attempt's records (observe/attempts.py), and at exit,
after the error is printed, the rank stops torchrun's agent (observe/error_file.py): torchrun's
``--max-restarts`` restarts on any failure, so the launch must end before the agent sees a plain
non-zero exit. Should a restart start anyway (a rank of another node, a race), ``refuse_restart``
ends it before it trains. The orchestrator reads the same records and fails the Dagster step
without a retry, in the runtime's words.
"""

from __future__ import annotations

import atexit
import logging
import os
import traceback
from typing import Any, Callable, Mapping, Protocol

from training_runtime.config import ConfigError
from training_runtime.distributed.elastic import ELASTIC_ENV
from training_runtime.observe.attempts import (
    DETERMINISTIC,
    RETRYABLE,
    AttemptId,
    AttemptLog,
    attempts_root,
    current_attempt,
    elastic_attempt,
    earlier_deterministic,
)
from training_runtime.observe.error_file import stop_elastic_agent
from training_runtime.observe.guards import NonFiniteLoss

log = logging.getLogger(__name__)


class TrainingPreempted(RuntimeError):
    """SIGTERM arrived; a checkpoint was saved and a restart resumes from it."""


class TrainFnError(RuntimeError):
    """A training function broke its contract (no figure reported, no model saved, no checkpoint
    to resume from); a new attempt runs the same code."""


class RestartRefused(RuntimeError):
    """A restarted attempt that would repeat its predecessor's deterministic failure."""


# Programming errors: the same code on the same inputs raises them again.
_CODE_ERRORS = (TypeError, NameError, AttributeError, KeyError, IndexError, ValueError, AssertionError,
                NotImplementedError, ZeroDivisionError)


def classify(exc: BaseException) -> tuple[str, str]:
    """(DETERMINISTIC or RETRYABLE, a short cause) for an exception that ended a rank."""
    if isinstance(exc, RestartRefused):
        return DETERMINISTIC, "refused"
    if isinstance(exc, NonFiniteLoss):
        return DETERMINISTIC, "non-finite"
    if isinstance(exc, ConfigError):  # before ValueError: ConfigError is one
        return DETERMINISTIC, "config"
    if isinstance(exc, (ImportError, SyntaxError)):
        return DETERMINISTIC, "import"
    if isinstance(exc, TrainFnError):
        return DETERMINISTIC, "train_fn"
    if isinstance(exc, TrainingPreempted):
        return RETRYABLE, "preempted"
    if isinstance(exc, _CODE_ERRORS):
        return DETERMINISTIC, "code"
    return RETRYABLE, "error"


def _where(exc: BaseException) -> str:
    """Where a programming error was raised: the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (raised at {f.filename}:{f.lineno} in {f.name})"


def failure_record(exc: BaseException) -> dict[str, Any]:
    kind, cause = classify(exc)
    record: dict[str, Any] = {"kind": kind, "cause": cause, "exception": type(exc).__name__, "step": None,
                              "detection": None, "last_good_checkpoint": None}
    if isinstance(exc, NonFiniteLoss):
        record.update(message=str(exc), step=exc.detection.step, detection=exc.detection.to_dict(),
                      last_good_checkpoint=exc.last_good_checkpoint)
    elif cause in ("code", "error"):
        record["message"] = f"{type(exc).__name__}: {exc}{_where(exc)}"
    else:
        record["message"] = f"{type(exc).__name__}: {exc}" if cause == "import" else str(exc)
    return record


def _launch_of(raw: Mapping[str, Any]) -> int:
    launch = raw.get("launch", 1)
    return launch if isinstance(launch, int) and not isinstance(launch, bool) and launch >= 1 else 1


class Restarting(Protocol):
    """Told how this rank's failure is handed on (observe/pipes.py's reporter is rank 0's Pipes
    session): ``failed`` with its kind as soon as it is classified; ``recorded`` once it is in the
    attempt's records, which the orchestrator reads and states in the step's failure;
    ``restarting`` when torchrun starts another attempt after it."""

    def failed(self, kind: str) -> None: ...

    def recorded(self) -> None: ...

    def restarting(self, message: str) -> None: ...


class FailureRecorder:
    """One rank's failure bookkeeping for its attempt. ``log`` is None outside torchrun, or when
    the config names no checkpoint directory to put records beside. ``reporter`` is told when a
    failure is followed by a torchrun restart."""

    def __init__(self, log: AttemptLog | None, environ: Mapping[str, str],
                 at_exit: Callable[..., Any] = atexit.register, reporter: Restarting | None = None):
        self.log, self.environ, self.at_exit, self.reporter = log, environ, at_exit, reporter
        self.stopping = False

    @classmethod
    def for_config(cls, raw: Mapping[str, Any], environ: Mapping[str, str], rank: int,
                   at_exit: Callable[..., Any] = atexit.register,
                   reporter: Restarting | None = None) -> FailureRecorder:
        """From the config as read (not yet validated: a config error is recorded too)."""
        attempt = current_attempt(_launch_of(raw), environ)
        directory = (raw.get("checkpoint") or {}).get("dir") if isinstance(raw.get("checkpoint"), dict) else None
        if attempt is None or not isinstance(directory, str) or not os.path.isabs(directory):
            return cls(None, environ, at_exit, reporter)
        return cls(AttemptLog(attempts_root(directory), attempt, rank), environ, at_exit, reporter)

    def restart_follows(self, record: Mapping[str, Any]) -> bool:
        """Whether torchrun's agent restarts the workers after this rank's failure ``record``: a
        retryable failure under torchrun with restarts left, and no rank of this attempt recorded
        a deterministic one (that rank stops the agent). A rank whose peer fails sees the peer's
        record: the peer writes it before it exits, and this rank's collective fails only then."""
        if self.log is None or record["kind"] == DETERMINISTIC:
            return False
        # the agent's own count (an elastic gang's attempt names number rounds, not restarts)
        if _int(self.environ.get("TORCHELASTIC_RESTART_COUNT")) >= _int(self.environ.get("TORCHELASTIC_MAX_RESTARTS")):
            return False
        try:
            others = self.log.failures()
        except (OSError, ValueError):  # unreadable records: assume the agent stops, as it may
            return False
        return not any(f.get("kind") == DETERMINISTIC for f in others)

    @property
    def attempt(self) -> AttemptId | None:
        return self.log.attempt if self.log else None

    def agree_attempt(self, rank: int, broadcast: Callable[[Any], Any]) -> None:
        """An elastic gang's ranks take rank 0's name for this attempt (``elastic_attempt``), once
        the process group stands; ``broadcast`` sends rank 0's object to every rank. A fixed gang's
        ranks already agree (the restart count is the gang's)."""
        if self.log is None or not self.environ.get(ELASTIC_ENV):
            return
        agreed = broadcast(elastic_attempt(self.log.root, self.log.attempt) if rank == 0 else None)
        self.log = AttemptLog(self.log.root, agreed, self.log.rank)

    def refuse_restart(self) -> None:
        """Raise RestartRefused when an earlier attempt of this launch failed deterministically."""
        if self.log is None or self.log.attempt.restart == 0:
            return
        earlier = earlier_deterministic(self.log.root, self.log.attempt)
        if earlier is not None:
            raise RestartRefused(f"not restarted: attempt {earlier.id.name} failed in a way a restart repeats: "
                                 f"{earlier.reason}")

    def record(self, exc: BaseException) -> dict[str, Any]:
        """Write this rank's failure record; after a deterministic one, stop torchrun's agent at
        exit (after the traceback and torchelastic's error file are written)."""
        record = failure_record(exc)
        if self.reporter is not None:  # first: writing the record may fail (a full disk)
            self.reporter.failed(record["kind"])
        if self.log is not None:
            try:
                self.log.add_failure(record)
            except OSError as e:  # the volume itself failed: the exception still ends the rank
                log.error("could not record this rank's failure in %s: %s", self.log.dir, e)
            else:
                if self.reporter is not None:
                    self.reporter.recorded()
        if record["kind"] == DETERMINISTIC and self.environ.get("TORCHELASTIC_RUN_ID") and not self.stopping:
            self.stopping = True
            self.at_exit(stop_elastic_agent, dict(self.environ), str(self.log.dir) if self.log else None)
        if self.reporter is not None and self.log is not None and record["cause"] == "preempted" \
                and self.environ.get(ELASTIC_ENV):
            # An elastic gang's agent SIGTERMs its workers to re-form when a node joins (or after a
            # node is lost), and torchrun does not count that restart against max_restarts: so the
            # count cannot say whether one follows. The run's log says what happens next (the
            # session stays open after any retryable failure: observe/pipes.py).
            self.reporter.restarting(
                f"attempt {self.log.attempt.name} stopped on rank {self.log.rank} after its checkpoint: the elastic "
                "gang re-forms (a node joined or left) and resumes from it")
        elif self.reporter is not None and self.restart_follows(record):
            attempt = self.log.attempt
            self.reporter.restarting(
                f"attempt {attempt.name} ended on rank {self.log.rank}: {record['message']}; torchrun restarts "
                f"the workers (restart {attempt.restart + 1} of "
                f"{_int(self.environ.get('TORCHELASTIC_MAX_RESTARTS'))}), resuming from the last checkpoint")
        return record


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
