"""The files through which a sweep watches one of its trials and stops it.

The training job appends each validation to a JSON-lines report file; the sweep (ops/sweep.py)
reads what is new, hands it to Optuna's pruner and, when the pruner says so, creates the stop
file, which the job sees at its next validation. Both files live on the checkpoint volume that
the launching step and the workers share (a local directory, or the Kubernetes shared claim), so
one mechanism serves both launchers and survives a restart of either side.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def append_report(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """One line per validation, written whole and flushed: a reader never sees half a record
    except as an unfinished last line, which it leaves for later."""
    line = json.dumps(record, sort_keys=True, allow_nan=True) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_reports(path: str | os.PathLike, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Records written since byte ``offset``, and the offset to read from next time."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # an unfinished last line waits for its newline
    records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return records, offset + end


def request_stop(path: str | os.PathLike, reason: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"reason": reason}))
    os.replace(tmp, path)


def stop_reason(path: str | os.PathLike | None) -> str | None:
    """Why the trial was asked to stop, or None when it was not."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text()).get("reason") or "stop requested"
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, OSError):
        return "stop requested"
