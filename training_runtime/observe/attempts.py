"""What every attempt of a training leaves beside its checkpoints, so that a torchrun restart, a
Dagster retry and the orchestrator all know how each attempt ended, why, and what its guards saw.

``<checkpoint.dir>/../attempts/<attempt>/``, on the volume every rank and the orchestrator share:

- ``attempt.json`` (rank 0, at the start, on resume and at the end): launch, restart count,
  torchrun run id, world size, the step it resumed from, whether it completed;
- ``rank<r>.detections.jsonl`` (each rank, as they happen): the guards' detections, one JSON
  object a line (those every rank reaches from the same gathered figures are written by rank 0);
- ``rank0.reported.jsonl`` (rank 0, at each ``ctx.report``): the figures a training function
  reported, one JSON object a line, so metrics.json's ``reported`` keeps every attempt's;
- ``rank<r>.failure.json`` (a rank that failed): its exception, whether a new attempt can fix it
  (``retryable``) or would repeat it (``deterministic``), the step, the detection that stopped
  it and the last good checkpoint.

``<attempt>`` is ``L<launch>-R<restart>-<run id>``: the launch comes from the config (the
orchestrator counts its launches), the restart count and run id from torchrun, so every rank names
the same folder by itself, before any process group exists. Records are written under torchrun
only (a plain process has no agent that restarts it, and its caller sees the exception).
Stdlib only: the orchestrator reads them without importing torch.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from training_runtime.atomic_files import atomic_write_bytes

ATTEMPTS_DIR = "attempts"
ATTEMPT_FILE = "attempt.json"
REPORTED = "reported.jsonl"  # rank0.reported.jsonl: what rank 0 reported, per attempt
DETERMINISTIC = "deterministic"  # a new attempt would fail the same way: no restart, no retry
RETRYABLE = "retryable"  # a new attempt may succeed: a killed worker, a lost node, a hang, an outage
_NAME = re.compile(r"^L(\d+)-R(\d+)-(.+)$")


def attempts_root(checkpoint_dir: str | os.PathLike) -> Path:
    """Where a training's attempt records live: beside its checkpoint directory."""
    return Path(checkpoint_dir).parent / ATTEMPTS_DIR


def _safe(run: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:64]


@dataclass(frozen=True, order=True)
class AttemptId:
    launch: int
    restart: int
    run: str

    @property
    def name(self) -> str:
        return f"L{self.launch:03d}-R{self.restart:03d}-{_safe(self.run)}"

    @classmethod
    def from_name(cls, name: str) -> AttemptId | None:
        m = _NAME.match(name)
        return cls(int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def current_attempt(launch: int, environ: Mapping[str, str]) -> AttemptId | None:
    """This process's attempt under torchrun (its agent sets the run id and restart count); None
    outside torchrun."""
    run = environ.get("TORCHELASTIC_RUN_ID")
    if not run:
        return None
    return AttemptId(launch, int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")), _safe(run))


def elastic_attempt(root: str | os.PathLike, proposed: AttemptId) -> AttemptId:
    """Rank 0's name for an elastic gang's new attempt, which every rank then takes (broadcast).

    In an elastic gang the restart count is each agent's own: a membership change restarts the
    workers without counting, and a node that joins late counts from 0. So the ranks of one group
    disagree on it, and two groups can share it. Rank 0 numbers the attempts of its launch in the
    order they start instead: one more than the highest so far."""
    taken = [a.restart for a in (AttemptId.from_name(p.name) for p in Path(root).glob(f"L{proposed.launch:03d}-R*"))
             if a is not None and a.launch == proposed.launch]
    return AttemptId(proposed.launch, max(taken, default=-1) + 1, proposed.run)


def _plain(value: Any) -> Any:
    """A reported value JSON cannot hold as it is: a tensor or numpy scalar as its number (or
    list), anything else as its text."""
    for convert in ("item", "tolist"):
        if callable(getattr(value, convert, None)):
            try:
                return getattr(value, convert)()
            except (ValueError, RuntimeError):  # not a one-element tensor: tolist next
                continue
    return str(value)


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode())


class AttemptLog:
    """The records one rank writes about its attempt."""

    def __init__(self, root: str | os.PathLike, attempt: AttemptId, rank: int):
        self.root, self.attempt, self.rank = Path(root), attempt, rank
        self.dir = self.root / attempt.name

    def _attempt_file(self) -> Path:
        return self.dir / ATTEMPT_FILE

    def start(self, world_size: int) -> None:
        """Rank 0, once the process group stands: the attempt exists even if it is killed later."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self._attempt_file(), {
            "launch": self.attempt.launch, "restart_count": self.attempt.restart, "run_id": self.attempt.run,
            "world_size": world_size, "started_at": time.time(), "resumed_from_step": None, "completed": False})

    def update(self, **fields: Any) -> None:
        """Rank 0: change fields of attempt.json (resumed_from_step, completed)."""
        path = self._attempt_file()
        record = json.loads(path.read_text()) if path.is_file() else {}
        _write_json(path, {**record, **fields})

    def add_detection(self, detection: Mapping[str, Any]) -> None:
        """Appended and flushed at once: a worker killed a moment later keeps what it saw."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"rank{self.rank}.detections.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(detection), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def add_reported(self, entry: Mapping[str, Any]) -> None:
        """Rank 0: one ``ctx.report``'s figures, appended as they are reported. Flushed, not
        synced: a killed worker's writes survive in the page cache (a lost node takes the
        attempt's last figures with it; they are figures, not state to resume from)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"rank{self.rank}.{REPORTED}", "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(entry), sort_keys=True, default=_plain) + "\n")

    def failures(self) -> list[dict[str, Any]]:
        """The failure records every rank of this attempt has written so far."""
        return [json.loads(p.read_text()) for p in sorted(self.dir.glob("rank*.failure.json"))]

    def add_failure(self, record: Mapping[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.dir / f"rank{self.rank}.failure.json", {"rank": self.rank, "at": time.time(), **record})


@dataclass
class Attempt:
    """One attempt, read back: how it ended (``ended``), why (``reason``), what its guards saw."""

    id: AttemptId
    world_size: int | None = None
    started_at: float | None = None
    resumed_from_step: int | None = None
    completed: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)
    detections: list[dict[str, Any]] = field(default_factory=list)
    ended: str = "failed"  # "completed", "failed" or "restarted" (a later attempt followed)
    reason: str | None = None
    failure: dict[str, Any] | None = None  # the rank failure that explains how it ended

    @property
    def deterministic(self) -> bool:
        return self.failure is not None and self.failure.get("kind") == DETERMINISTIC

    def to_metrics(self) -> dict[str, Any]:
        """The attempt as metrics.json lists it (training_runtime/README.md, "attempts")."""
        return {"restart_count": self.id.restart, "resumed_from_step": self.resumed_from_step,
                "world_size": self.world_size, "started_at": self.started_at, "name": self.id.name,
                "ended": self.ended, "reason": self.reason, "detections": list(self.detections)}


def _read_detections(directory: Path) -> list[dict[str, Any]]:
    seen, out = set(), []
    for path in sorted(directory.glob("rank*.detections.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:  # a line torn by a kill mid-write: the ones before it stand
                continue
            key = json.dumps(d, sort_keys=True)
            if isinstance(d, dict) and key not in seen:
                seen.add(key)
                out.append(d)
    return sorted(out, key=lambda d: (d.get("step") or 0, -1 if d.get("rank") is None else d["rank"]))


def _read_attempt(directory: Path, attempt: AttemptId) -> Attempt:
    a = Attempt(attempt)
    meta_path = directory / ATTEMPT_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        a.world_size, a.started_at = meta.get("world_size"), meta.get("started_at")
        a.resumed_from_step, a.completed = meta.get("resumed_from_step"), bool(meta.get("completed"))
    a.failures = sorted((json.loads(p.read_text()) for p in directory.glob("rank*.failure.json")),
                        key=lambda f: f.get("rank", 0))
    a.detections = _read_detections(directory)
    if a.started_at is None and a.failures:
        a.started_at = min(f.get("at", 0.0) for f in a.failures)
    return a


def _explaining(failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rank failure that says why the attempt ended: a deterministic one first (a rank whose
    peers then failed in a collective is the cause, not its peers), then one with a detection
    (the hang watchdog's), then the earliest."""
    if not failures:
        return None
    return min(failures, key=lambda f: (f.get("kind") != DETERMINISTIC, f.get("detection") is None,
                                        f.get("at", 0.0), f.get("rank", 0)))


def _conclude(a: Attempt, followed: bool) -> None:
    a.failure = _explaining(a.failures)
    if a.completed and a.failure is None:
        a.ended, a.reason = "completed", None
        return
    silent = []
    if a.world_size and not a.completed:  # after completing, a rank fails alone (its evaluation)
        recorded = {f.get("rank") for f in a.failures}
        silent = [r for r in range(a.world_size) if r not in recorded]
    note = (f"rank(s) {', '.join(map(str, silent))} ended without recording a failure (killed, out of memory, "
            "or their node was lost)") if silent else ""
    if a.deterministic:
        a.ended, a.reason = "failed", a.failure["message"]
        return
    a.ended = "restarted" if followed else "failed"
    if a.failure is not None:
        a.reason = a.failure["message"] + (f"; {note}" if note else "")
    else:
        a.reason = note or "no rank recorded why it ended (the workers were killed, or their node was lost)"


def read_attempts(root: str | os.PathLike) -> list[Attempt]:
    """Every attempt under ``root``, oldest first, each concluded: an attempt that neither
    completed nor failed deterministically "restarted" when a later one followed it."""
    root = Path(root)
    found = []
    if root.is_dir():
        for p in root.iterdir():
            attempt = AttemptId.from_name(p.name) if p.is_dir() else None
            if attempt is not None:
                found.append(_read_attempt(p, attempt))
    found.sort(key=lambda a: (a.id.launch, a.id.restart, a.started_at or 0.0, a.id.run))
    for i, a in enumerate(found):
        _conclude(a, followed=i + 1 < len(found))
    return found


def next_launch(root: str | os.PathLike) -> int:
    """The launch number of a new launch of the training whose records are under ``root``."""
    root = Path(root)
    names = [AttemptId.from_name(p.name) for p in root.iterdir()] if root.is_dir() else []
    return 1 + max((n.launch for n in names if n is not None), default=0)


def earlier_deterministic(root: str | os.PathLike, attempt: AttemptId) -> Attempt | None:
    """An earlier attempt of this same torchrun launch that failed in a way a restart repeats."""
    for a in read_attempts(root):
        if (a.id.launch, a.id.run) == (attempt.launch, attempt.run) and a.id.restart < attempt.restart \
                and a.deterministic:
            return a
    return None


def metrics_attempts(attempts: list[Attempt]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(``attempts``, ``detections``) of metrics.json: each attempt's record, and the detections
    of every attempt in the order they happened, each with ``attempt`` (1: the first)."""
    detections = [{**d, "attempt": i} for i, a in enumerate(attempts, 1) for d in a.detections]
    return [a.to_metrics() for a in attempts], detections


def read_reported(root: str | os.PathLike, attempt: AttemptId) -> list[dict[str, Any]]:
    """What rank 0 of ``attempt`` reported, in order (a line torn by a kill is left out)."""
    path = Path(root) / attempt.name / f"rank0.{REPORTED}"
    out = []
    for line in (path.read_text(encoding="utf-8").splitlines() if path.is_file() else []):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def metrics_reported(root: str | os.PathLike, attempts: list[Attempt], current: AttemptId,
                     current_reported: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """metrics.json's ``reported``: every attempt's figures in the order they were reported, each
    with ``attempt`` (1: the first, as in ``attempts``). An attempt restarted from a checkpoint
    reports some steps again; both reports are kept, told apart by their attempt. ``current``'s
    are ``current_reported`` (this process's own list)."""
    out: list[dict[str, Any]] = []
    for i, a in enumerate(attempts, 1):
        entries = current_reported if a.id == current else read_reported(root, a.id)
        out.extend({**e, "attempt": i} for e in entries)
    return out


@dataclass(frozen=True)
class LaunchOutcome:
    """How one launch of a training failed, as the orchestrator tells it."""

    deterministic: bool
    message: str  # the runtime's own words
    attempts: tuple[Attempt, ...]
    failure: dict[str, Any] | None

    @property
    def last_good_checkpoint(self) -> str | None:
        return (self.failure or {}).get("last_good_checkpoint")


def launch_outcome(root: str | os.PathLike, launch: int) -> LaunchOutcome | None:
    """Why launch ``launch`` failed, from its attempts' records; None when none were left."""
    mine = tuple(a for a in read_attempts(root) if a.id.launch == launch)
    if not mine:
        return None
    stopped = [a for a in mine if a.deterministic]
    # A restart that refused to run repeats its predecessor's cause; the first says it best.
    cause = next((a for a in stopped if a.failure.get("cause") != "refused"), stopped[0] if stopped else None)
    if cause is not None:
        return LaunchOutcome(True, cause.failure["message"], mine, cause.failure)
    last = mine[-1]
    return LaunchOutcome(False, last.reason or "the training failed", mine, last.failure)
