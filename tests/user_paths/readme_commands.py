"""README's first documented commands, in README's order, with what each must do on an empty
DAGSTER_HOME. The one list the fresh-home test runs (tests/user_paths/test_fresh_home.py) and the
docs point at: change a quick start command in the docs, change it here.

Each is run as typed from the repository root (``.venv/bin/python``, ``.venv/bin/dagster``, with
``make demo`` as the command make runs for it), in a fresh process, with DAGSTER_HOME an empty
folder and nothing else prepared. ``after_demo`` is what the command prints once ``make demo`` ran;
``alone`` what it prints on the empty home without it: either works, or fails with a message that
names the command to run. Commands that train take minutes and run only in the heavy test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the .venv/bin the tests run from


@dataclass(frozen=True)
class Expected:
    status: int  # exit status
    says: tuple[str, ...]  # text the output (stdout and stderr) must contain


@dataclass(frozen=True)
class DocumentedCommand:
    where: str  # the README section it is documented in
    argv: tuple[str, ...]  # "python" and "dagster" are the repository's .venv/bin ones
    after_demo: Expected
    alone: Expected | None = None  # None: it needs nothing before it (or trains, see ``trains``)
    trains: bool = False  # runs trainings: minutes on two cores (the heavy test)


DEMO = DocumentedCommand(
    "Quick start: make demo", ("python", "-m", "pipelines", "demo"), trains=True,
    after_demo=Expected(0, ("Run ", "succeeded.", "digits v1", "wine v1", "best trial")))

COMMANDS: tuple[DocumentedCommand, ...] = (
    DEMO,
    DocumentedCommand(
        "Quick start: print a model version's lineage", ("python", "-m", "pipelines", "lineage", "digits"),
        after_demo=Expected(0, ("digits v1", "quality gate", "passed")),
        alone=Expected(2, ("model 'digits' (code location 'platform') has no registered versions yet",
                           "python -m pipelines train digits"))),
    DocumentedCommand(
        "Quick start: print a model version's lineage",
        ("python", "-m", "pipelines", "lineage", "digits", "--version", "1", "--json"),
        after_demo=Expected(0, ('"model": "digits"', '"version": 1')),
        alone=Expected(2, ("has no registered versions yet",))),
    # The command issue 27 saw fail on a fresh home: its error now names the one that writes the data.
    DocumentedCommand(
        "Add a pipeline: run a job with the Dagster CLI",
        ("dagster", "job", "execute", "-m", "pipelines.definitions", "-a", "defs", "-j", "digits_training"),
        trains=True, after_demo=Expected(0, ("RUN_SUCCESS",)),
        alone=Expected(1, ("matches no file", "python -m pipelines sources examples",
                           "python -m pipelines sources add digits"))),
    DocumentedCommand(
        "Where sources live", ("python", "-m", "pipelines", "sources", "examples"),
        after_demo=Expected(0, ("digits/digits.csv", "platform/sources")),
        alone=Expected(0, ("digits/digits.csv", "platform/sources"))),
    DocumentedCommand(
        "Add a pipeline: run a job with the Dagster CLI",
        ("dagster", "job", "execute", "-m", "pipelines.definitions", "-a", "defs", "-j", "wine_training"),
        trains=True, after_demo=Expected(0, ("raw_expectations", "shard_expectations", "RUN_SUCCESS"))),
    DocumentedCommand(
        "Add a pipeline: the lineage of what it registered", ("python", "-m", "pipelines", "lineage", "wine"),
        after_demo=Expected(0, ("wine v", "dataset         wine-d1 (location platform)", "quality gate    passed")),
        alone=Expected(2, ("model 'wine' (code location 'platform') has no registered versions yet",))),
)


def run_documented(command: DocumentedCommand, home: Path, timeout: float) -> subprocess.CompletedProcess:
    """``command`` as typed from the repository root, in a fresh process: DAGSTER_HOME ``home``, no
    PYTHONPATH (the venv has the project installed), no other platform setting of this process."""
    program, *rest = command.argv
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PLATFORM_PROFILE") and not k.startswith(("DAGSTER_", "TRAINING_RUNTIME_"))}
    return subprocess.run([str(BIN / program), *rest], cwd=REPO, env={**env, "DAGSTER_HOME": str(home)},
                          capture_output=True, text=True, timeout=timeout)


def check_documented(command: DocumentedCommand, proc: subprocess.CompletedProcess, expected: Expected) -> None:
    """The exit status and text ``expected``; a failing ``python -m pipelines`` says so in one line."""
    said = proc.stdout + proc.stderr
    shown = f"$ {' '.join(command.argv)}  ({command.where})\n{said[-4000:]}"
    assert proc.returncode == expected.status, shown
    missing = [text for text in expected.says if text not in said]
    assert not missing, f"{missing} not in the output of {shown}"
    if command.argv[0] == "python" and expected.status != 0:
        assert "Traceback (most recent call last)" not in said, f"a traceback instead of a one-line error: {shown}"
