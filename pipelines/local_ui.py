"""``make ui``: the Dagster UI and the platform's TensorBoard beside it, started and stopped together.

``python -m pipelines.local_ui [--host H] [--port P] [--tensorboard-port T] [--workspace FILE]``
runs ``dagster dev`` and a TensorBoard over the local artifact store's ``models/`` area, where
every training's event files are copied while it trains (ops/live_tensorboard.py). Both servers
learn their addresses from the environment this sets for them and everything they start (code
servers, run workers): ``DAGSTER_WEBSERVER_HOST``/``_PORT``, which dagster-webserver serves on and
run links are made of (pipelines/profiles.served_ui_url), and ``TENSORBOARD_URL``,
which the runs' TensorBoard links are made of. A ``DAGSTER_UI_URL`` or ``TENSORBOARD_URL``
already set (a proxy in front) is kept.

Ctrl+C (SIGINT), SIGTERM or SIGHUP stops both; so does either one exiting, and the exit status is
then that server's. Each runs in its own process group, which is ended whole: dagster dev's
webserver, daemon, code servers and runs with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ops.tensorboard_events import tensorboard_logdir
from pipelines.cli.tensorboard import DEFAULT_PORT as DEFAULT_TENSORBOARD_PORT
from pipelines.cli.tensorboard import DEFAULT_RELOAD_S, port_number, server_command
from pipelines.profiles import (
    DEFAULT_UI_HOST,
    DEFAULT_UI_PORT,
    REPO_ROOT,
    TENSORBOARD_URL_ENV,
    WEBSERVER_ENV,
    Profile,
    served_ui_url,
)

# dagster dev needs a while to stop its webserver and daemon (it waits on each); then the group is killed.
STOP_GRACE_S = 20.0
POLL_S = 0.5
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def ui_environment(environ: Mapping[str, str], *, host: str, port: int, tensorboard_port: int) -> dict[str, str]:
    """The environment of both servers: ``environ`` with the addresses they serve on."""
    env = dict(environ)
    host_env, port_env, _ = WEBSERVER_ENV
    env[host_env], env[port_env] = host, str(port)
    shown = DEFAULT_UI_HOST if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    if not (env.get(TENSORBOARD_URL_ENV) or "").strip():
        env[TENSORBOARD_URL_ENV] = f"http://{shown}:{tensorboard_port}"
    return env


def ui_commands(profile: Profile, *, host: str, tensorboard_port: int, workspace: Path,
                reload_s: int = DEFAULT_RELOAD_S) -> dict[str, list[str]]:
    """What ``make ui`` runs, by name: dagster dev on ``workspace``, TensorBoard on the artifact store."""
    if profile.name != "local":
        raise SystemExit(f"make ui serves the local profile; PLATFORM_PROFILE is {profile.name!r}. On Kubernetes the "
                         "Helm chart deploys the UI and TensorBoard (docs/experiments.md, Live curves)")
    logdir = tensorboard_logdir(profile.resources()["artifacts"].get())
    return {
        # No -h/-p: the webserver reads DAGSTER_WEBSERVER_HOST/_PORT, as the code location does for run links.
        "dagster dev": [sys.executable, "-m", "dagster", "dev", "-w", str(workspace)],
        "TensorBoard": server_command(logdir, host=host, port=tensorboard_port, reload_s=reload_s),
    }


def run_together(commands: Mapping[str, Sequence[str]], env: Mapping[str, str], *, cwd: Path = REPO_ROOT,
                 grace_s: float = STOP_GRACE_S) -> int:
    """Start every command, each in its own process group; when one exits or a stop signal comes,
    stop them all. Returns 0 after a stop signal, else the exit status of the one that ended first."""
    stop: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: stop.append(signum)) for sig in _STOP_SIGNALS}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, command in commands.items():
            procs[name] = subprocess.Popen(list(command), env=dict(env), cwd=cwd, start_new_session=True)
        ended = None
        while ended is None and not stop:
            ended = next((name for name, proc in procs.items() if proc.poll() is not None), None)
            if ended is None:
                time.sleep(POLL_S)
        if ended is not None:
            code = procs[ended].returncode
            print(f"{ended} exited with status {code}; stopping the others", file=sys.stderr, flush=True)
            return code or 1  # a server that ends by itself never means "done": the UI is down
        return 0
    finally:
        stop_all(procs, grace_s)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_all(procs: Mapping[str, subprocess.Popen], grace_s: float) -> None:
    """SIGINT to every group (what Ctrl+C in a terminal sends), then SIGKILL to the groups still there."""
    for proc in procs.values():
        _signal_group(proc, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs.values():
        _signal_group(proc, signal.SIGKILL)  # children the leader left behind go too
        proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass  # the whole group is gone already


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.local_ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=DEFAULT_UI_HOST, help=f"Address both serve on (default {DEFAULT_UI_HOST}).")
    parser.add_argument("--port", type=port_number, default=DEFAULT_UI_PORT,
                        help=f"The Dagster UI's port (default {DEFAULT_UI_PORT}).")
    parser.add_argument("--tensorboard-port", type=port_number, default=DEFAULT_TENSORBOARD_PORT,
                        help=f"TensorBoard's port (default {DEFAULT_TENSORBOARD_PORT}).")
    parser.add_argument("--workspace", type=Path, default=REPO_ROOT / "workspace.yaml",
                        help="The Dagster workspace (default: the repository's workspace.yaml).")
    parser.add_argument("--reload-s", type=int, default=DEFAULT_RELOAD_S,
                        help=f"How often TensorBoard looks for new events, in seconds (default {DEFAULT_RELOAD_S}).")
    args = parser.parse_args(argv)
    if args.port == args.tensorboard_port:
        parser.error(f"--port and --tensorboard-port are both {args.port}; give TensorBoard another port")
    env = ui_environment(os.environ, host=args.host, port=args.port, tensorboard_port=args.tensorboard_port)
    profile = Profile.from_environment()
    commands = ui_commands(profile, host=args.host, tensorboard_port=args.tensorboard_port,
                           workspace=args.workspace.absolute(), reload_s=args.reload_s)
    # A new home has no trainings yet: TensorBoard shows them as their first event files arrive.
    Path(tensorboard_logdir(profile.resources()["artifacts"].get())).mkdir(parents=True, exist_ok=True)
    print(f"Dagster UI: {served_ui_url(env)}  TensorBoard: {env[TENSORBOARD_URL_ENV]}  (Ctrl+C stops both)",
          flush=True)
    return run_together(commands, env)


if __name__ == "__main__":
    sys.exit(main())
