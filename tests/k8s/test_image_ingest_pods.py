"""An image folder's raw ingest over step pods, as on Kubernetes (issue 41, item 4): the platform's
``k8s_job_executor`` configuration runs each ingest group (assets/image_ingest_steps.py) as a Job
whose pod runs ``dagster api execute_step`` (the stand-in API server and kubelet of
tests/k8s/step_pods.py, the instance and code location of tests/k8s/test_step_pods.py). The
groups' files reach the version in one raw commit, equal to what one process makes, and an
ingest pod that dies is retried alone in a new pod."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from assets.kinds.image_ingest import ingest_images
from pipelines.models.shapes import write_shapes_source
from tests.k8s.step_pod_definitions import SPEC
from tests.k8s.step_pods import StepPodCluster
from tests.k8s.test_step_pods import _execute, _store, _version_images, step_pods  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

RAW = "datasets/shapes/raw/"


def _ingest_pods(cluster: StepPodCluster) -> list:
    return [p for p in cluster.pods.values() if "_ingest_parts[" in p.step_key]


def _raw_commits(store) -> list:
    return [c for c in store.log("main") if len(c.parents) == 1 and store.diff(c.parents[0], c.id, prefix=RAW)]


def test_each_ingest_group_runs_in_a_pod_of_its_own_and_the_raw_copy_is_one_commit_equal_to_one_pass(
        step_pods, tmp_path):  # noqa: F811
    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    sources = home / "platform" / "sources"
    folder = write_shapes_source(sources, per_class=40, seed=3)

    with _execute(instance) as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        ingest_steps = {e.step_key for e in result.all_events if e.is_step_success and "_ingest_parts[" in e.step_key}
    cluster.wait()

    pods = _ingest_pods(cluster)
    assert len(pods) == len(ingest_steps) >= 2 and {p.step_key for p in pods} == ingest_steps
    assert all(p.exit_code == 0 for p in pods) and len({p.proc.pid for p in pods}) == len(pods)
    manifest = cluster.manifests[pods[0].job]
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == ["dagster", "api", "execute_step"]

    store = _store(home)
    (raw_commit,) = _raw_commits(store)  # the groups staged their files; publish made one commit
    index = json.loads(store.get_object("main", RAW + "parts.json"))
    assert len(index["parts"]) > len(pods)  # several parts a pod (SPEC: two a step)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    one = ingest_images(SPEC, sorted(folder.rglob("*.jpg")), sources, tmp_path / "one", salt=index["salt"])
    assert store.get_object(raw_commit.id, RAW + "parts.json") == (one.path / "parts.json").read_bytes()
    assert all(store.get_object(raw_commit.id, RAW + p.relative_to(one.path).as_posix()) == p.read_bytes()
               for p in one.path.rglob("*.parquet"))
    assert store.get_object(raw_commit.id, "datasets/shapes/validation/raw_dataset.json") == one.report.to_json()
    assert _version_images(home) == files


def test_an_ingest_step_whose_pod_dies_is_retried_alone_in_a_new_pod(step_pods):  # noqa: F811
    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    folder = write_shapes_source(home / "platform" / "sources", per_class=40, seed=3)
    killed: list[str] = []

    def kill_first_ingest_pod(pod) -> None:  # a node lost under the step's pod, once it has started
        if "_ingest_parts[" in pod.step_key and not killed:
            killed.append(pod.job)
            threading.Timer(1.0, StepPodCluster.end, args=(pod, signal.SIGKILL, 0.0)).start()

    cluster.on_start = kill_first_ingest_pod
    with _execute(instance) as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
    cluster.wait()

    lost = cluster.pods[killed[0]]
    assert lost.exit_code == -signal.SIGKILL
    again = [p for p in _ingest_pods(cluster) if p.step_key == lost.step_key]
    assert len(again) == 2 and again[1].exit_code == 0 and restarted == [lost.step_key]
    others = [p.step_key for p in cluster.pods.values() if p.step_key != lost.step_key]
    assert len(others) == len(set(others))  # every other step's pod ran once
    assert len(_raw_commits(_store(home))) == 1
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    assert _version_images(home) == files
