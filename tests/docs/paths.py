"""Repository paths named by the pages: each must exist, unless .gitignore says it is runtime state
(``dagster_home/platform/...``, ``test-artifacts/...``) that a run creates."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pathspec

REPO = Path(__file__).resolve().parents[2]
# Placeholders and patterns (<model>, *.csv, {a,b}, $VAR) name no one file.
NOT_A_PATH = re.compile(r"[<>*{}$?\[\]]")


@lru_cache(maxsize=1)
def ignored() -> pathspec.PathSpec:
    return pathspec.PathSpec.from_lines("gitwildmatch", (REPO / ".gitignore").read_text().splitlines())


@lru_cache(maxsize=1)
def top_level() -> frozenset[str]:
    return frozenset(p.name for p in REPO.iterdir() if not p.name.startswith("."))


def repo_path(token: str) -> str | None:
    """The repository-relative path ``token`` names, or None when it names none: a token is taken for
    a path when its first segment is a top-level entry of the repository and it has a '/' or a
    file suffix (``helm/README.md``, ``Makefile`` alone is not checked). ``:line`` and trailing
    punctuation are cut off."""
    token = token.strip().strip("`'\"").rstrip(".,;)")
    token = token.split("::", 1)[0]  # a pytest node id names its file
    token = re.sub(r":\d+(:\d+)?:?$", "", token).rstrip(":")
    if not token or NOT_A_PATH.search(token) or " " in token or token.startswith(("/", "http")):
        return None
    first = token.split("/", 1)[0]
    if first not in top_level() or ("/" not in token and "." not in first):
        return None
    return token


def path_problem(token: str, base: Path = REPO) -> str | None:
    """None if ``token`` names no repository path or one that exists (relative to ``base`` or the
    repository root); else what is wrong."""
    path = repo_path(token)
    if path is None:
        return None
    if any(p.exists() for p in (REPO / path, base / path, REPO / f"{path}.py")):  # a module named without .py
        return None
    if ignored().match_file(path) or ignored().match_file(path.rstrip("/") + "/"):
        return None
    return f"{path!r} does not exist in the repository"
