"""Every fenced block of a page, with the marker that says how its example is tested.

A marker is an HTML comment on the line right above the opening fence (invisible on the site):

    <!-- example: run -->                  shell: run the commands against a prepared DAGSTER_HOME;
                                           python: run with DAGSTER_HOME set to it
    <!-- example: run exit=2 -->           ... and expect that exit status
    <!-- example: excerpt PATH -->         python/yaml/json: the lines are copied from PATH (excerpts.py)
    <!-- example: external REASON -->      shell: needs what a test machine lacks (Docker, a cluster)
    <!-- example: output -->               a block of recorded output or a sketch: nothing to run

No marker means the language's default: python runs, shell commands are checked without running,
yaml and json are parsed, a block with no language is output. docs/index.md ("How these pages are tested")
is the convention as users and writers read it; this module is what enforces it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sybil import Document, Region
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

MARKER = re.compile(r"^[ \t]*<!--\s*example:\s*(?P<kind>[\w-]+)(?P<args>[^\n]*?)\s*-->[ \t]*$")
KINDS = ("run", "excerpt", "external", "output")
SHELL = ("bash", "sh", "shell", "console")
PYTHON = ("python", "py")
YAML = ("yaml", "yml")
JSON = ("json",)
TEXT = ("", "text", "output")
LANGUAGES = SHELL + PYTHON + YAML + JSON + TEXT


class MarkerError(ValueError):
    """A block whose marker or language the example tests do not know."""


@dataclass(frozen=True)
class Block:
    language: str
    kind: str  # one of KINDS, or "default"
    args: str  # what follows the kind in the marker
    source: str
    line: int  # of the opening fence, 1-based

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.language or 'no language'} block, {self.kind})"


def marker_above(text: str, fence_start: int) -> tuple[str, str] | None:
    """The marker on the non-blank line just above the fence at ``fence_start``, if any."""
    before = text[:fence_start].rstrip("\n").rstrip()
    last = before.rsplit("\n", 1)[-1]
    match = MARKER.match(last)
    return (match["kind"], match["args"].strip()) if match else None


def check_block(block: Block) -> None:
    """Refuse what would make a block untested by mistake: an unknown language or marker, a marker
    that means nothing for the language, a reason-less external block."""
    fix = "see docs/index.md, 'How these pages are tested'"
    if block.language not in LANGUAGES:
        raise MarkerError(f"{block.where}: no example test knows the language {block.language!r}; "
                          f"use one of {', '.join(repr(x) for x in LANGUAGES if x)} or none ({fix})")
    if block.kind not in KINDS + ("default",):
        raise MarkerError(f"{block.where}: unknown marker 'example: {block.kind}'; use one of {', '.join(KINDS)} ({fix})")
    allowed = {"run": SHELL + PYTHON, "external": SHELL, "excerpt": PYTHON + YAML + JSON,
               "output": TEXT + SHELL + YAML + JSON}
    if block.kind in allowed and block.language not in allowed[block.kind]:
        raise MarkerError(f"{block.where}: 'example: {block.kind}' does not apply to a {block.language or 'plain'} "
                          f"block ({fix})")
    if block.kind in ("external", "excerpt") and not block.args:
        what = "the reason it cannot run here" if block.kind == "external" else "the file it is copied from"
        raise MarkerError(f"{block.where}: 'example: {block.kind}' needs {what} after it ({fix})")
    if block.kind == "run" and block.args and not re.fullmatch(r"exit=\d+", block.args):
        raise MarkerError(f"{block.where}: 'example: run' takes only exit=N, not {block.args!r} ({fix})")


class BlockParser:
    """A Sybil parser yielding one region per fenced block; ``evaluate`` decides what each means."""

    def __init__(self, evaluate):
        self.lexer = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE))
        self.evaluate = evaluate

    def __call__(self, document: Document):
        for region in self.lexer(document):
            info = region.lexemes["info"].strip()
            language = info.split()[0].lower() if info else ""
            source = str(region.lexemes["source"])
            if language in TEXT and any(line.startswith("$ ") for line in source.splitlines()):
                language = "console"  # a session with recorded output: its commands are examples too
            found = marker_above(document.text, region.start)
            kind, args = found if found else ("default", "")
            line = document.text.count("\n", 0, region.start) + 1
            block = Block(language=language, kind=kind, args=args, source=source, line=line)
            yield Region(region.start, region.end, parsed=block, evaluator=self.evaluate)
