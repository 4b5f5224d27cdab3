"""The code version a model was trained with: the git commit of this checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def code_version(repo_root: Path = REPO_ROOT) -> dict:
    """{"git_sha", "dirty"}; outside a git checkout (an image without .git), says so explicitly."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root,
                                capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return {"git_sha": None, "dirty": None, "unavailable_because": f"not a git checkout ({type(exc).__name__})"}
    return {"git_sha": sha, "dirty": bool(status.strip())}
