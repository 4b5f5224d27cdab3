"""What an image was built from, and the check that it is the code the orchestrator launched.

The images' Dockerfiles run ``python -m training_runtime.observe.build_info --git-sha ... --dirty ...`` at
build time, which writes ``BUILD.json`` (git sha and dirty flag, computed from the checkout by
``core.code_version``'s ``--build-args``, and which user-code package the image carries). The
Kubernetes launcher passes the orchestrator's own code version to the pods in
``MODEL_FACTORY_CODE_VERSION``; each rank compares the two before it touches data or GPUs, so a
pod running an older image (a stale tag, a node's cached ``:latest``) fails at once with both
versions named, instead of training with code other than the run records.

Plain Python: the entry point imports this before torch is set up, the code location too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

from training_runtime.config import ConfigError

BUILD_INFO_FILE = "/opt/model-factory/BUILD.json"
# Overrides BUILD_INFO_FILE: tests and local pod simulations point it at a file of their own.
BUILD_INFO_ENV = "MODEL_FACTORY_BUILD_INFO"
# JSON {"git_sha", "dirty"}: the orchestrator's code version, set on the training pods by the launcher.
EXPECTED_CODE_VERSION_ENV = "MODEL_FACTORY_CODE_VERSION"
# The pod's own facts, from the manifest (resources/k8s/manifests.py): the image reference it was
# started from, and the node and pod names through the downward API.
IMAGE_ENV = "MODEL_FACTORY_IMAGE"
NODE_NAME_ENV = "NODE_NAME"
POD_NAME_ENV = "POD_NAME"

_SHA = re.compile(r"^[0-9a-f]{40}$")
# The fields two code versions must agree on; the rest of BUILD.json is description.
COMPARED = ("git_sha", "dirty")


class CodeVersionMismatch(ConfigError):
    """The image's recorded code version is not the one the orchestrator launched."""


def build_info_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(BUILD_INFO_ENV) or BUILD_INFO_FILE)


def read_build_info(path: Path) -> dict[str, Any] | None:
    """BUILD.json's content, or None where there is none (a checkout, not an image)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        info = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not JSON ({e}): rebuild the image from helm/images/") from e
    if not isinstance(info, dict) or "git_sha" not in info or "dirty" not in info:
        raise ConfigError(f"{path} lacks git_sha/dirty: rebuild the image from helm/images/")
    return info


def build_record(*, git_sha: str, dirty: str | bool, user_code: str = "") -> dict[str, Any]:
    """The BUILD.json of an image; the git sha must be a full commit, as `git rev-parse HEAD` prints."""
    if not _SHA.match(git_sha or ""):
        raise ConfigError(
            f"git sha {git_sha!r} is not a 40-hex commit: build with "
            "`docker build $(python -m core.code_version --build-args) ...` from the checkout "
            "(it passes GIT_SHA and GIT_DIRTY)")
    if isinstance(dirty, str):
        if dirty not in ("true", "false"):
            raise ConfigError(f"dirty must be 'true' or 'false', got {dirty!r} (build arg GIT_DIRTY)")
        dirty = dirty == "true"
    return {"git_sha": git_sha, "dirty": dirty, "user_code": user_code}


def check_code_version(expected: dict[str, Any], recorded: dict[str, Any] | None, *, image: str | None,
                       where: Path) -> None:
    """Raise CodeVersionMismatch unless the image records the code version the run expects."""
    fix = ("Fix: rebuild and push the training image from the same commit as the code location "
           "(`docker build $(python -m core.code_version --build-args) -f helm/images/training.Dockerfile ...`) "
           "and set TRAINING_IMAGE to its new tag, or deploy the code location of the image's commit.")
    shown = image or "the training image"
    if recorded is None:
        raise CodeVersionMismatch(
            f"{shown} records no code version ({where} is missing) but the run expects git "
            f"{expected.get('git_sha')} dirty={expected.get('dirty')}. {fix}")
    if expected.get("git_sha") is None:
        raise CodeVersionMismatch(
            f"the orchestrator does not know its own code version ({expected.get('unavailable_because')}), "
            f"so it cannot be matched with {shown}'s git {recorded['git_sha']}: run the code location "
            "from a git checkout or from an image built with "
            "`docker build $(python -m core.code_version --build-args) ...`, which records BUILD.json.")
    if any(expected.get(k) != recorded.get(k) for k in COMPARED):
        raise CodeVersionMismatch(
            f"{shown} was built from git {recorded['git_sha']} dirty={recorded['dirty']}, but the run "
            f"expects git {expected['git_sha']} dirty={expected['dirty']} (the orchestrator's code). {fix}")
    if expected.get("dirty"):
        # Two builds of one dirty commit compare equal here yet may hold different edits: the sha
        # cannot tell them apart, so say so rather than claim a match.
        print(f"warning: code version git {expected['git_sha']} is dirty: image and orchestrator match by "
              "commit only; uncommitted edits may differ", file=sys.stderr)


def verify_image(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """In a pod the launcher started (EXPECTED_CODE_VERSION_ENV set): fail unless the image's
    BUILD.json matches. Without that variable (a local torchrun launch, no image) it checks
    nothing. Returns the image's build record, if any."""
    env = os.environ if environ is None else environ
    path = build_info_path(env)
    recorded = read_build_info(path)
    raw = env.get(EXPECTED_CODE_VERSION_ENV)
    if raw:
        try:
            expected = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{EXPECTED_CODE_VERSION_ENV} is not JSON ({e}); the launcher sets it") from e
        check_code_version(expected, recorded, image=env.get(IMAGE_ENV), where=path)
    return recorded


def pod_facts(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Where this process runs, as the pod sees it: image reference, node and pod names (the
    downward API's), the host name where there is no pod."""
    env = os.environ if environ is None else environ
    return {"image": env.get(IMAGE_ENV), "node": env.get(NODE_NAME_ENV) or socket.gethostname(),
            "pod": env.get(POD_NAME_ENV)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training_runtime.observe.build_info",
                                     description="Write an image's BUILD.json (run by the Dockerfiles).")
    parser.add_argument("--git-sha", required=True)
    parser.add_argument("--dirty", required=True, help="'true' or 'false'")
    parser.add_argument("--user-code", default="", help="the user-code package copied into the image")
    parser.add_argument("--out", default=BUILD_INFO_FILE)
    args = parser.parse_args(argv)
    try:
        record = build_record(git_sha=args.git_sha, dirty=args.dirty, user_code=args.user_code)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
