"""The code version a model was trained with: the git commit of this checkout, or, in an image
built without .git, the commit its build recorded (training_runtime/observe/build_info.py's BUILD.json).

``python -m core.code_version --build-args`` prints the ``docker build`` arguments that record this
checkout's version in an image (helm/images/*.Dockerfile), so image and orchestrator compute it alike.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def code_version(repo_root: Path = REPO_ROOT) -> dict:
    """{"git_sha", "dirty"}; outside a git checkout, the image's BUILD.json; without either, says so
    explicitly."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root,
                                capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        from training_runtime.observe.build_info import build_info_path, read_build_info

        recorded = read_build_info(build_info_path())
        if recorded is not None:
            return {"git_sha": recorded["git_sha"], "dirty": recorded["dirty"], "source": "image build"}
        return {"git_sha": None, "dirty": None, "unavailable_because": f"not a git checkout ({type(exc).__name__})"}
    return {"git_sha": sha, "dirty": bool(status.strip())}


def build_args(version: dict) -> list[str]:
    """The Dockerfiles' GIT_SHA and GIT_DIRTY build arguments for ``version``."""
    if not version.get("git_sha"):
        raise ValueError(f"no code version to record ({version.get('unavailable_because')}): build the images "
                         "from a git checkout")
    return ["--build-arg", f"GIT_SHA={version['git_sha']}",
            "--build-arg", f"GIT_DIRTY={'true' if version['dirty'] else 'false'}"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--build-args"]:
        sys.exit("usage: python -m core.code_version --build-args")
    print(" ".join(build_args(code_version())))
