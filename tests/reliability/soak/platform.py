"""The platform the soak runs against: a real Dagster instance, webserver and daemon, two code
locations, the lakeFS test server (behind its fault proxy) and SeaweedFS.

- The instance is the platform's own local one (dagster_home/dagster.yaml: run queue, per-model
  and per-team limits, run monitoring, run retries), with two changes for a 2-core machine: at
  most 3 runs at once, and run monitoring every 5 s so a killed run worker is found quickly.
- Locations: ``platform`` (location.py: digits and the wine sweep) and ``soakteam``, a team
  package copied into a folder outside the repository (team_package/), as tests/user_paths does.
- The platform's processes keep their temporary files (shards being built, Pipes message files)
  on a scratch volume of their own (TMPDIR), a small tmpfs the soak mounts where it may (as root),
  so the disk-full fault can fill it for a while (faults.py). Without one, that fault is not
  injected and the soak says so.
- Every process is started in its own process group and ended with it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipelines.profiles import LOCAL_INSTANCE_CONFIG
from resources.platform import VersionedStoreResource
from tests.reliability.soak.profile import LOCAL, REPOSITORY
from tests.support.lakefs_server import LakeFSTestServer
from tests.support.ports import free_ports
from tests.support.seaweed import SeaweedServer
from tests.ui.webserver import _stop_group, _wait_until_serving
from tests.user_paths.matrix import write_workspace
from training_runtime.observe.pipes import LEDGER_ENV

REPO = Path(__file__).resolve().parents[3]
TEAM_PACKAGE = "soakteam"
MAX_CONCURRENT_RUNS = 3
MONITORING_POLL_S = 5
SCRATCH_SIZE = "256m"


def instance_config() -> str:
    """The platform's local instance config with the soak's two changes (module text)."""
    config = yaml.safe_load(LOCAL_INSTANCE_CONFIG.read_text())
    config["concurrency"]["runs"]["max_concurrent_runs"] = MAX_CONCURRENT_RUNS
    config["run_monitoring"]["poll_interval_seconds"] = MONITORING_POLL_S
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class SoakPlatform:
    root: Path
    launcher: str = LOCAL
    lakefs: LakeFSTestServer | None = None
    seaweed: SeaweedServer | None = None
    url: str = ""
    webserver: subprocess.Popen | None = None
    daemon: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    scratch: Path | None = None  # the mounted TMPDIR of the platform's processes, if one could be mounted
    scratch_refused: str = ""  # why not
    s3_outages: int = 0  # S3 outages begun so far (the s3_stopped fault), and whether one is on now
    s3_down: bool = False
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def data_root(self) -> Path:
        return self.root / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "pipes-ledger"

    def start(self) -> SoakPlatform:
        for folder in (self.home, self.data_root, self.logs, self.ledger_dir):
            folder.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text(instance_config())
        team_root = self.root / "team-code"
        shutil.copytree(Path(__file__).parent / "team_package", team_root / TEAM_PACKAGE,
                        ignore=shutil.ignore_patterns("__pycache__"))
        workspace = write_workspace(self.root / "workspace.yaml", team_root,
                                    platform_module="tests.reliability.soak.location", team_package=TEAM_PACKAGE)
        self._mount_scratch()
        secret = secrets.token_hex(16)
        self.lakefs = self._stack.enter_context(LakeFSTestServer(
            self.root / "lakefs", access_key_id="AKIASOAKTEST", secret_access_key=secret, stall_s=5))
        self.seaweed = self._stack.enter_context(SeaweedServer(self.root / "weed", bucket="soak"))
        self.env = {
            **{k: v for k, v in os.environ.items()
               if not k.startswith(("DAGSTER_", "SOAK_", "TRAINING_RUNTIME_FAULT_", "PLATFORM_PROFILE"))},
            "DAGSTER_HOME": str(self.home), "PYTHONPATH": str(REPO),
            "SOAK_DATA_ROOT": str(self.data_root), "SOAK_LAUNCHER": self.launcher,
            "SOAK_LAKEFS_ENDPOINT": self.lakefs.endpoint, "SOAK_LAKEFS_ACCESS_KEY_ID": self.lakefs.access_key_id,
            "SOAK_LAKEFS_SECRET_ACCESS_KEY": secret,
            "SOAK_S3_ENDPOINT": self.seaweed.endpoint_url, "SOAK_S3_BUCKET": self.seaweed.bucket,
            # Workers read s3:// shards through the lakeFS gateway with lakeFS's key (SeaweedFS
            # without identities takes any key), from their environment only, as in a pod.
            "AWS_ACCESS_KEY_ID": self.lakefs.access_key_id, "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            LEDGER_ENV: str(self.ledger_dir),
            **({"TMPDIR": str(self.scratch)} if self.scratch else {}),
        }
        self._stack.callback(self._stop_processes)
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        self.webserver = self._spawn("webserver", [sys.executable, "-m", "dagster_webserver", "-w", str(workspace),
                                                   "-h", "127.0.0.1", "-p", str(port)])
        _wait_until_serving(self.webserver, self.url, self.logs / "webserver.log", 300)
        self.daemon = self._spawn("daemon", [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w",
                                             str(workspace)])
        return self

    def _mount_scratch(self) -> None:
        folder = self.root / "scratch"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_SIZE}", "tmpfs", str(folder)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            self.scratch_refused = f"mounting a tmpfs failed: {(done.stderr or done.stdout).strip()}"
            return
        self.scratch = folder
        # Lazily, after every process is gone: a straggler's open file must not keep it mounted.
        self._stack.callback(subprocess.run, ["umount", "-l", str(folder)], capture_output=True, timeout=30)

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        with (self.logs / f"{name}.log").open("w") as log:
            return subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _stop_processes(self) -> None:
        for proc in (self.daemon, self.webserver):
            if proc is not None:
                _stop_group(proc)

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> SoakPlatform:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # --- clients -------------------------------------------------------------------------------
    def store_resource(self, *, through_faults: bool) -> VersionedStoreResource:
        """The store as the platform sees it (through the fault proxy), or as the soak's checks
        see it (directly: an observer's reads must neither suffer nor use up injected faults)."""
        endpoint = self.lakefs.endpoint if through_faults else self.lakefs.direct_endpoint
        return VersionedStoreResource(kind="lakefs", repository=REPOSITORY, lakefs_endpoint=endpoint,
                                      lakefs_access_key_id=self.lakefs.access_key_id,
                                      lakefs_secret_access_key=self.env["SOAK_LAKEFS_SECRET_ACCESS_KEY"],
                                      lakefs_storage_namespace=f"local://{REPOSITORY}")

    def artifact_bytes(self, store_path: str) -> bytes:
        """An object of the artifact store, read with the platform's key. Through a client of
        the soak's own: AWS_* must stay out of this process's environment, since SeaweedFS,
        restarted from here by a fault, would take them for its only identity."""
        client = self.seaweed.client(self.env["AWS_ACCESS_KEY_ID"], self.env["AWS_SECRET_ACCESS_KEY"])
        return client.get_object(Bucket=self.seaweed.bucket, Key=f"artifacts/{store_path}")["Body"].read()

    def webserver_answers(self, timeout_s: float = 30.0) -> str | None:
        """None when the webserver answers /server_info; else why not."""
        if self.webserver.poll() is not None:
            return f"the webserver exited with {self.webserver.returncode}"
        try:
            with urllib.request.urlopen(self.url + "/server_info", timeout=timeout_s) as resp:
                return None if resp.status == 200 else f"/server_info answered {resp.status}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            return f"/server_info failed: {exc!r}"

    def daemon_alive(self, instance, max_age_s: float = 180.0) -> str | None:
        """None when the daemon process lives and every daemon's heartbeat is recent; else why not."""
        if self.daemon.poll() is not None:
            return f"the daemon exited with {self.daemon.returncode}"
        beats = instance.get_daemon_heartbeats()
        if not beats:
            return "the daemon has written no heartbeat"
        now = time.time()
        stale = sorted(name for name, beat in beats.items() if now - beat.timestamp > max_age_s)
        return f"stale daemon heartbeats: {', '.join(stale)}" if stale else None

