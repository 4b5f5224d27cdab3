"""The ``tensorboard`` command: every version of a model side by side in TensorBoard.

Each version's lineage record names the artifact folder of its training run's event files
(``checkpoint.tensorboard_path``, written by the training op). The command copies them into a
local log directory, one subdirectory per version (``v1``, ``v2``, ...: TensorBoard's run
names), and serves it with the ``tensorboard`` server, or with ``--no-serve`` only prepares it.

Runs in progress are watched in the platform's own TensorBoard over the artifact store (``make
ui``, pipelines/local_ui.py; the chart's on Kubernetes), which each run links to
(ops/live_tensorboard.py). ``server_command`` is how every one of them starts the server.
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
DEFAULT_RELOAD_S = 5  # TensorBoard's own default: how often it looks for new events


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
    from pipelines.cli.lookup import require_model

    profile = Profile.from_environment()
    require_model(args, profile.store())
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
    try:
        return subprocess.run(server_command(str(logdir), host=host, port=port)).returncode
    except KeyboardInterrupt:
        return 0  # the server got the same Ctrl+C and stopped


def server_args(logdir: str, *, host: str, port: int, reload_s: int = DEFAULT_RELOAD_S,
                path_prefix: str = "") -> list[str]:
    """The ``tensorboard`` server's arguments, here and in the Helm chart's Deployment
    (tests/k8s/test_tensorboard_chart.py holds them equal). ``logdir`` is a folder or an ``s3://``
    URI. The Python loader (``--load_fast=false``) reads both (S3 through boto3, no TensorFlow
    needed) and reopens each file at every reload, so a file the live copy replaces
    (ops/tensorboard_events.EventFileSync) is read on; TensorBoard's Rust loader reads no S3, and
    one loader everywhere keeps the local server what the chart runs."""
    args = [f"--logdir={logdir}", f"--host={host}", f"--port={port}", "--load_fast=false",
            f"--reload_interval={reload_s}"]
    return args + ([f"--path_prefix={path_prefix}"] if path_prefix else [])


def server_command(logdir: str, **kwargs) -> list[str]:
    """This environment's TensorBoard server on ``logdir`` (``server_args`` for the rest)."""
    return [sys.executable, "-m", "tensorboard.main", *server_args(logdir, **kwargs)]
