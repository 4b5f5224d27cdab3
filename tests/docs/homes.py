"""The DAGSTER_HOME that ``<!-- example: run -->`` blocks run against, and running them there.

It is the CLI tests' demo platform (two real digits versions, tests/cli/demo_platform.py), built
once per session and shared with those tests, as it was before they changed it; each page gets
its own copy, so a page that comments or promotes changes no other page's.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path
from typing import Callable

from tests.docs.shell import program


DOCS_USER = "alice"


class PageHomes:
    """Lazily: a copy of the prepared home per page, made on the page's first run block."""

    def __init__(self, prepared: Callable[[], Path], root: Path):
        self.prepared = prepared
        self.root = root
        self.copies: dict[str, Path] = {}

    def for_page(self, page: str) -> Path:
        if page not in self.copies:
            target = self.root / Path(page).name.replace(".", "_") / "home"
            shutil.copytree(self.prepared(), target, symlinks=True)
            self.copies[page] = target
        return self.copies[page]


@contextlib.contextmanager
def environment(**values: str | None):
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_pipelines_cli(argv: list[str], home: Path, copied_from: Path | None = None) -> tuple[int, list[str]]:
    """``python -m pipelines ARGS`` in this process against ``home`` (a DAGSTER_HOME written in
    the command is replaced by it): its exit status and its stdout and stderr as one stream, with
    ``home`` and the home it was ``copied_from`` (which its records name) written $DAGSTER_HOME.
    In-process, since a fresh interpreter per command would cost seconds each."""
    if program(argv) != "python" or argv[1:3] != ["-m", "pipelines"]:
        raise AssertionError(f"'example: run' runs 'python -m pipelines ...' commands only, not {argv[0]!r}; "
                             "leave the marker out to have the command checked instead")
    from pipelines.cli import main

    out = io.StringIO()
    # The OS user is who the audit trail names when no lakeFS user is behind the store: the same
    # one on every machine, so recorded output names the same user.
    with environment(DAGSTER_HOME=str(home), PLATFORM_PROFILE=None, LOGNAME=DOCS_USER, USER=DOCS_USER), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv[3:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    text = out.getvalue().replace(str(home), "$DAGSTER_HOME")
    if copied_from is not None:
        text = text.replace(str(copied_from), "$DAGSTER_HOME")
    return code, text.rstrip("\n").splitlines()
