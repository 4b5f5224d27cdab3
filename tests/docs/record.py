"""Re-record the output of a page's ``<!-- example: run -->`` sessions from the commands themselves.

    python -m tests.docs.record docs/questioning-versions.md [--home DIR]

The commands run against a copy of DIR, or of $MODEL_FACTORY_DEMO_HOME, or of a demo platform
built for the occasion (two digits trainings, about a minute; tests/cli/demo_platform.py), exactly
as the example tests run them; the lines after each ``$`` command are replaced by what it printed.
Review the change with ``git diff`` before committing it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sybil import Document

from tests.docs.blocks import SHELL, Block, BlockParser
from tests.docs.homes import run_pipelines_cli
from tests.docs.shell import parse_commands

REPO = Path(__file__).resolve().parents[2]


def session_lines(source: str, outputs: list[list[str]]) -> str:
    """``source`` with the output after its n-th ``$`` command replaced by ``outputs[n]``."""
    out: list[str] = []
    n = -1
    continued = False
    for line in source.splitlines():
        if continued or line.startswith("$ "):
            if not continued:
                n += 1
            out.append(line)
            continued = line.rstrip().endswith("\\")
            if not continued:
                out.extend(outputs[n])
    return "\n".join(out) + "\n"


def record_page(page: Path, home: Path, prepared: Path | None = None) -> int:
    """Rewrite ``page``'s run sessions; returns how many blocks were recorded."""
    text = page.read_text()
    blocks: list[tuple[int, int, Block]] = []
    document = Document(text, str(page))
    for region in BlockParser(evaluate=None)(document):
        block: Block = region.parsed
        if block.kind == "run" and block.language in SHELL and "$ " in block.source:
            start = text.index(block.source, region.start)
            blocks.append((start, start + len(block.source), block))
    recorded = []  # run in page order, as the example tests do: a later block may see an earlier one's effect
    for start, end, block in blocks:
        outputs = []
        for command in parse_commands(block.source, block.line + 1):
            for env, argv in command.simple_commands():
                code, lines = run_pipelines_cli(argv, home, prepared)
                print(f"{page.name}:{command.line}: exit {code}: {command.text}")
                outputs.append(lines)
        recorded.append((start, end, session_lines(block.source, outputs)))
    for start, end, new in reversed(recorded):  # from the end, so earlier offsets stay valid
        text = text[:start] + new + text[end:]
    page.write_text(text)
    return len(blocks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--home", type=Path, default=os.environ.get("MODEL_FACTORY_DEMO_HOME"),
                        help="A prepared DAGSTER_HOME to copy (default: $MODEL_FACTORY_DEMO_HOME, else one is built).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prepared = args.home
        if prepared is None:
            from tests.cli.demo_platform import build_demo_platform

            prepared = build_demo_platform(Path(tmp) / "prepared").home
        for page in args.pages:
            home = Path(tmp) / page.stem / "home"
            shutil.copytree(prepared, home, symlinks=True)
            print(f"{page}: {record_page(page.resolve(), home, Path(prepared).resolve())} block(s) recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
