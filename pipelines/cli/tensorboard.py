"""The ``tensorboard`` command: every version of a model side by side in TensorBoard.

Each version's lineage record names the artifact folder of its training run's event files
(``checkpoint.tensorboard_path``, written by the training op). The command copies them into a
local log directory, one subdirectory per version (``v1``, ``v2``, ...: TensorBoard's run
names), and serves it with the ``tensorboard`` server, or with ``--no-serve`` only prepares it.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.registry import list_versions, read_lineage
from pipelines.cli.errors import UsageError
from pipelines.profiles import Profile
from resources.artifacts.base import ArtifactStore
from resources.store.base import VersionedStore

DEFAULT_PORT = 6006  # TensorBoard's own default


@dataclass(frozen=True)
class PreparedLogdir:
    logdir: Path
    copied: dict[int, int]  # version -> event files copied
    without_events: list[int]  # versions whose records name no event files


def port_number(text: str) -> int:
    """A TCP port, 1..65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; give one from 1 to 65535, e.g. 6006")
    return int(text)


def default_logdir(profile: Profile, model: str) -> Path:
    return profile.data_root / "tensorboard" / model


def prepare_logdir(store: VersionedStore, artifacts: ArtifactStore, model: str, logdir: Path,
                   versions: list[int] | None = None) -> PreparedLogdir:
    """Copy the event files of ``versions`` (default: all) of ``model`` to ``logdir/v<N>/``. Each
    ``v<N>`` folder is replaced, so a second call shows exactly the store's files; other contents of
    ``logdir`` are left alone."""
    registered = list_versions(store, model)
    wanted = registered if not versions else sorted(set(versions))
    if not registered:
        read_lineage(store, model)  # raises the one-line "no registered versions" error
    copied: dict[int, int] = {}
    without: list[int] = []
    for version in wanted:
        record = read_lineage(store, model, version)  # raises for a version the model does not have
        prefix = (record.get("checkpoint") or {}).get("tensorboard_path")
        keys = artifacts.list_keys(prefix) if prefix else []
        if not keys:
            without.append(version)
            continue
        target = logdir / f"v{version}"
        if target.exists():
            shutil.rmtree(target)
        for key in keys:
            artifacts.get_file(key, target / key[len(prefix):])
        copied[version] = len(keys)
    if not copied:
        raise UsageError(
            f"no version of {model!r} among {', '.join(f'v{v}' for v in wanted)} has TensorBoard event files: "
            "versions registered before the runtime wrote them, or trained with telemetry.tensorboard off, have "
            "none; train a new version")
    return PreparedLogdir(logdir=logdir, copied=copied, without_events=without)


def tensorboard_command(args: argparse.Namespace) -> int:
    profile = Profile.from_environment()
    logdir = Path(args.logdir).absolute() if args.logdir else default_logdir(profile, args.model)
    prepared = prepare_logdir(profile.store(), profile.resources()["artifacts"].get(), args.model, logdir,
                              args.versions)
    for version, count in prepared.copied.items():
        print(f"{args.model} v{version}: {count} event file(s) -> {logdir / f'v{version}'}")
    if prepared.without_events:
        print(f"no event files for {', '.join(f'v{v}' for v in prepared.without_events)} (registered before "
              "TensorBoard logging, or trained with telemetry.tensorboard off)")
    if args.no_serve:
        print(f"log directory ready: {logdir}")
        return 0
    return serve(logdir, args.host, args.port)


def serve(logdir: Path, host: str, port: int) -> int:
    """Run the TensorBoard server on ``logdir`` until it exits or Ctrl+C."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError("the tensorboard package is not installed; `pip install tensorboard` (make installs it)")
    # Bound to every address, the server is reached by this machine's name.
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    print(f"TensorBoard: http://{shown}:{port}/#timeseries (Ctrl+C stops it)", flush=True)
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host, "--port", str(port)]
    try:
        return subprocess.run(cmd).returncode
    except KeyboardInterrupt:
        return 0  # the server got the same Ctrl+C and stopped
