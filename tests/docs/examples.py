"""What each block of a page means as a test (the convention is in docs/index.md, "How these pages
are tested"), and the Sybil instance that finds the blocks of every page of the site and README."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml
from sybil import Example, Sybil

from tests.docs.blocks import JSON, PYTHON, SHELL, YAML, Block, BlockParser, check_block
from tests.docs.excerpts import check_excerpt
from tests.docs.homes import PageHomes, environment, run_pipelines_cli
from tests.docs.paths import path_problem
from tests.docs.python_blocks import build_pipelines, run_block, specs_of
from tests.docs.shell import Command, check, output_differs, parse_commands

REPO = Path(__file__).resolve().parents[2]


@dataclass
class PageContext:
    """What a page's examples share: put in its Sybil namespace as ``_page`` by the test."""
    homes: PageHomes
    data_root: Path  # where pipelines built from python blocks keep their (unused) local state


def pages() -> list[Path]:
    """README, the generated reports the site includes, and every page of the site."""
    return [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "RELIABILITY.md",
            *sorted((REPO / "docs").rglob("*.md"))]


def evaluate(example: Example) -> str | None:
    block: Block = example.parsed
    check_block(block)
    page: PageContext = example.namespace["_page"]
    if block.kind == "output":
        return None
    if block.language in PYTHON:
        if block.kind == "excerpt":
            module = check_excerpt(block.source, block.args, block.language)
            build_pipelines(specs_of(module), page.data_root)
        elif block.kind == "run":
            with environment(DAGSTER_HOME=str(page.homes.for_page(example.path)), PLATFORM_PROFILE=None):
                run_block(example, page.data_root)
        else:
            run_block(example, page.data_root)
    elif block.language in YAML + JSON:
        if block.kind == "excerpt":
            check_excerpt(block.source, block.args, block.language)
        elif block.language in JSON:
            json.loads(block.source)
        else:
            list(yaml.safe_load_all(block.source))
    elif block.language in SHELL:
        return evaluate_shell(block, parse_commands(block.source, block.line + 1), page, example.path)
    return None


def evaluate_shell(block: Block, commands: list[Command], page: PageContext, path: str) -> str | None:
    if not commands:
        return f"{block.where}: a shell block with no command; mark recorded output 'example: output'"
    failures = []
    for command in commands:
        where = f"line {command.line}: {command.text}"
        try:
            parts = command.simple_commands()
        except ValueError as exc:
            failures.append(f"{where}\n  cannot be split into words: {exc}")
            continue
        for env, argv in parts:
            try:
                if block.kind == "external":
                    problems = [p for token in argv for p in [path_problem(token.partition("=")[2] or token)] if p]
                    if problems:
                        raise AssertionError("; ".join(problems))
                elif block.kind == "run":
                    expected = int(block.args.partition("=")[2] or 0)
                    code, output = run_pipelines_cli(argv, page.homes.for_page(path), page.homes.prepared())
                    if code != expected:
                        raise AssertionError(f"exit status {code}, the page expects {expected}:\n  "
                                             + "\n  ".join(output[-20:]))
                    if command.output and (diff := output_differs(command.output, output)):
                        raise AssertionError("the recorded output is not what the command prints; re-record "
                                             f"it with 'python -m tests.docs.record {Path(path).relative_to(REPO)}':\n{diff}")
                else:
                    check(env, argv)
            except AssertionError as exc:
                failures.append(f"{where}\n  {shlex.join(argv)}: {exc}")
    return "\n".join(failures) or None


def sybil() -> Sybil:
    return Sybil(parsers=[BlockParser(evaluate)], patterns=["*.md"], path=str(REPO))
