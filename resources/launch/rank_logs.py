"""Where the training workers' own output is kept on disk, and the names it gets in the artifact store.

A launcher keeps each launch's worker output in a folder of its own, ``<log root>/launch_<k>/``
(k counts from 0; a Dagster retry of the step is the next launch, and earlier ones stay):

- local torchrun (``--log-dir <launch folder> --tee 3``) writes, per restart attempt and local rank,
  ``<rendezvous run id>_<random>/attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}``;
  these are named ``launch_<k>/attempt_<n>/rank_<r>.{stdout.log,stderr.log,error.json}``; a local
  gang of several nodes (gang.py) keeps each node's apart, named
  ``launch_<k>/node_<i>-<start>/attempt_<n>/local_rank_<r>.<file>``;
- the Kubernetes launcher writes each pod's container logs, gathered before the Job is deleted,
  as ``<pod>/<container>.log`` (``.previous.log`` for a restarted container's earlier run);
  these keep their relative path as their name.

Stdlib only: both launchers and the ops layer import it.
"""

from __future__ import annotations

import re
from pathlib import Path

# Under a launcher's per-job folder: <job folder>/logs/launch_<k>/...
WORKER_LOG_DIR = "logs"
LAUNCH_PREFIX = "launch_"

# One torchrun launch makes exactly one rendezvous run folder (tempfile.mkdtemp, so its name is
# random); the name drops it. local rank == global rank: the local launcher runs one node.
# A local gang (gang.py) keeps each node's torchrun apart, ``launch_<k>/node_<i>-<start>/...``, where
# the number is the node's local rank.
_TORCHRUN_FILE = re.compile(
    r"^(?P<launch>launch_\d+)/(?:(?P<node>node_\d+-\d+)/)?[^/]+/(?P<attempt>attempt_\d+)/(?P<rank>\d+)/"
    r"(?P<file>stdout\.log|stderr\.log|error\.json)$"
)


def new_launch_dir(root: Path) -> Path:
    """Create and return the next unused ``root/launch_<k>``."""
    root.mkdir(parents=True, exist_ok=True)
    while True:
        taken = [int(p.name[len(LAUNCH_PREFIX):]) for p in root.iterdir()
                 if p.name.startswith(LAUNCH_PREFIX) and p.name[len(LAUNCH_PREFIX):].isdigit()]
        path = root / f"{LAUNCH_PREFIX}{max(taken, default=-1) + 1}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue  # another launch of the same job took this number first


def artifact_name(relative: str) -> str:
    """The name a file under a log root is kept by: torchrun's per-rank files as
    ``launch_<k>/attempt_<n>/rank_<r>.<file>``, any other file by its relative path."""
    match = _TORCHRUN_FILE.match(relative)
    if not match:
        return relative
    if match["node"]:
        return f"{match['launch']}/{match['node']}/{match['attempt']}/local_rank_{match['rank']}.{match['file']}"
    return f"{match['launch']}/{match['attempt']}/rank_{match['rank']}.{match['file']}"


def log_files(root: Path | None) -> dict[str, Path]:
    """Every file under ``root`` by its artifact name, sorted by name; empty when there is no root.

    Two files that would share a name (two rendezvous folders in one launch, which torchrun does not
    make) both stay, the second under its full relative path, so nothing is overwritten."""
    if root is None or not root.is_dir():
        return {}
    found: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        name = artifact_name(relative)
        found[relative if name in found else name] = path
    return dict(sorted(found.items()))
