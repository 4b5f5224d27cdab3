"""``<!-- example: excerpt PATH -->``: a block copied from a file of the repository.

The block's lines must appear in PATH in the same order and verbatim (trailing spaces aside); a
line ``...`` in the block stands for any number of the file's lines. A Python file is then
imported, so the code shown runs as the file's code; a YAML or JSON file is parsed.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ELLIPSIS = "..."


def missing_lines(block: str, text: str) -> str | None:
    """None when ``block`` is an excerpt of ``text``; else which of its runs of lines is not in the
    file where the excerpt says it is. The block may sit deeper in the file than on the page (Sybil
    hands blocks over dedented): every line is then indented by the same amount."""
    lines = [line.rstrip() for line in text.splitlines()]
    segments: list[list[str]] = [[]]
    for line in block.strip("\n").splitlines():
        if line.strip() == ELLIPSIS:
            segments.append([])
        else:
            segments[-1].append(line.rstrip())
    segments = [s for s in segments if s]
    if not segments:
        return "the block is empty"
    first = segments[0][0]
    indents = sorted({line[:len(line) - len(first)] for line in lines
                      if line.endswith(first) and not line[:len(line) - len(first)].strip()}, key=len)
    for indent in indents or [""]:
        # A line outside the indent can match no block line ("\0" marks it); blank lines match blank ones.
        shifted = [l[len(indent):] if l.startswith(indent) else (l if not l else "\0" + l) for l in lines]
        problem = runs_missing(segments, shifted)
        if problem is None:
            return None
    return problem


def runs_missing(segments: list[list[str]], lines: list[str]) -> str | None:
    at = 0  # each run of lines must start at or after the end of the run before it
    for segment in segments:
        starts = [i for i in range(at, len(lines) - len(segment) + 1) if lines[i:i + len(segment)] == segment]
        if not starts:
            return closest_mismatch(segment, lines, at)
        at = starts[0] + len(segment)  # the earliest match leaves the most room for the runs after it
    return None


def closest_mismatch(segment: list[str], lines: list[str], at: int) -> str:
    """Where the file parts from the run of lines that matches it longest."""
    def matching(i: int) -> int:
        n = 0
        while n < len(segment) and i + n < len(lines) and lines[i + n] == segment[n]:
            n += 1
        return n

    best = max(range(at, len(lines)), key=matching, default=None)
    n = 0 if best is None else matching(best)
    if n == 0:
        return f"the line {segment[0]!r} is not in the file (after the lines matched before it)"
    found = lines[best + n].lstrip("\0") if best + n < len(lines) else "<end of file>"
    return (f"file line {best + n + 1} is {found!r} where the block has {segment[n]!r} "
            f"(mark a gap with a '...' line)")


def module_name(path: Path) -> str:
    relative = path.resolve().relative_to(REPO).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def check_excerpt(block: str, relative: str, language: str):
    """The module (or parsed YAML) the excerpt comes from; raises AssertionError naming the problem."""
    path = REPO / relative
    if not path.is_file():
        raise AssertionError(f"'example: excerpt {relative}': no such file in the repository")
    problem = missing_lines(block, path.read_text())
    if problem:
        raise AssertionError(f"'example: excerpt {relative}': {problem}. Copy the block from the file again.")
    if path.suffix == ".py":
        if language not in ("python", "py"):
            raise AssertionError(f"'example: excerpt {relative}' is a Python file shown as a {language} block")
        return importlib.import_module(module_name(path))
    if path.suffix in (".yaml", ".yml"):
        return list(yaml.safe_load_all(path.read_text()))
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return None
