"""A table's raw ingest over step pods, as on Kubernetes (issue 41, item 4): the platform's
``k8s_job_executor`` configuration runs each group of source files (assets/table_ingest_steps.py)
as a Job whose pod runs ``dagster api execute_step`` (the stand-in API server and kubelet of
tests/k8s/step_pods.py, the instance of tests/k8s/test_step_pods.py). An ingest pod killed
(SIGKILL, as when its node is lost) is retried alone in a new pod, and the raw copy is one commit
equal, byte for byte, to what one step makes of the same files."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from pathlib import Path

import dagster as dg
import pytest

from assets import append, ingest
from assets.source import SourceChunks
from tests.k8s.step_pods import StepPodCluster
from tests.k8s.test_step_pods import IMAGE, _store, step_pods  # noqa: F401 (a fixture)
from tests.pipeline.test_table_ingest_steps import _write_files

pytestmark = pytest.mark.slow


def _execute(instance: dg.DagsterInstance) -> dg.ExecutionResult:
    from tests.k8s import table_ingest_pod_definitions

    job = dg.reconstructable(table_ingest_pod_definitions.events_job)
    job = job._replace(repository=job.repository._replace(container_image=IMAGE))
    return dg.execute_job(job, instance=instance, raise_on_error=False)


def _ingest_pods(cluster: StepPodCluster) -> list:
    return [p for p in cluster.pods.values() if "_ingest_files[" in p.step_key]


def test_an_ingest_pod_that_dies_is_retried_alone_and_the_raw_copy_is_one_steps(step_pods, tmp_path):  # noqa: F811
    alone, whole, why = table_ingest_pod_killed(step_pods, tmp_path)
    assert alone and whole, why


def table_ingest_pod_killed(step_pods, tmp_path) -> tuple[bool, bool, str]:
    """(the killed ingest step was retried alone in a new pod and no other step ran twice, main's
    raw copy is one commit equal byte for byte to one step's, what went otherwise): a table's
    first ingest pod of four is SIGKILLed a second after it starts.
    tests/reliability/test_data_faults.py records it as a class too."""
    from tests.k8s.table_ingest_pod_definitions import EVENTS

    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    files = _write_files(home / "platform" / "sources" / "events", "csv")
    killed: list[str] = []

    def kill_first_ingest_pod(pod) -> None:  # a node lost under the step's pod, once it has started
        if "_ingest_files[" in pod.step_key and not killed:
            killed.append(pod.job)
            threading.Timer(1.0, StepPodCluster.end, args=(pod, signal.SIGKILL, 0.0)).start()

    cluster.on_start = kill_first_ingest_pod
    with _execute(instance) as result:
        failures = [e.message for e in result.all_events if e.is_failure]
        restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
        success = result.success
    cluster.wait()
    if not success or not killed:
        return False, False, f"run failed: {failures}" if not success else "no ingest pod started"

    lost = cluster.pods[killed[0]]
    again = [p for p in _ingest_pods(cluster) if p.step_key == lost.step_key]
    others = [p.step_key for p in cluster.pods.values() if p.step_key != lost.step_key]
    alone = (lost.exit_code == -signal.SIGKILL and [p.exit_code for p in again] == [-signal.SIGKILL, 0]
             and restarted == [lost.step_key] and len(others) == len(set(others))  # no other step ran twice
             and len({p.step_key for p in _ingest_pods(cluster)}) == len(files) == 4)

    store = _store(home)
    raw = [c for c in store.log("main") if len(c.parents) == 1
           and store.diff(c.parents[0], c.id, prefix="datasets/events/raw/")]
    one_step = dataclasses.replace(EVENTS, source=dataclasses.replace(EVENTS.source, files_per_step=16))
    record = json.loads(store.get_object("main", ingest.ingest_record_path("events")))
    key = {k: record[k] for k in ("parameters", "code")}
    (tmp_path / "one").mkdir()
    one = append.ingest_source(one_step, "events/raw_dataset", one_step.expectations.raw(one_step),
                               SourceChunks(one_step, files, one_step.chunk_rows), tmp_path / "one" / "data.parquet",
                               key=key, published=None)
    whole = (len(raw) == 1
             and store.get_object("main", ingest.raw_path("events")) == one.path.read_bytes()
             and store.get_object("main", ingest.keys_path("events")) == one.keys.read_bytes()
             and record == one.record
             and store.get_object("main", "datasets/events/validation/raw_dataset.json") == one.report.to_json()
             and not store.list_objects("main", prefix="datasets/events/raw/steps/"))
    return alone, whole, (f"killed {lost.step_key}: exit codes of its pods {[p.exit_code for p in again]}, "
                          f"restarted {restarted}, raw commits on main {len(raw)}")
