"""A text corpus tokenized over step pods, as on Kubernetes (issue 41, item 4, for text): the
dataset's run executed by the platform's ``k8s_job_executor`` configuration, each step a Job of its
own whose pod runs ``dagster api execute_step`` (tests/k8s/step_pods.py, the API server and kubelet
stand-in, and the instance of tests/k8s/test_step_pods.py). The groups of new parts run in pods of
their own, every one encoding with the BPE tokenizer the plan step trained and staged, the version
is published in one commit equal to a single-step build, and a group whose pod dies is retried
alone, in a new pod, while the other steps' pods are not started again."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import dagster as dg
import pytest

from assets.kinds.text import TEXT
from assets.kinds.text_store import part_salt
from core.datasets import DATA_KEY
from tests.data.test_text_parts import _txt_corpus
from tests.k8s.step_pods import StepPodCluster
from tests.k8s.test_step_pods import IMAGE, _store, step_pods  # noqa: F401 (step_pods: the fixture)
from tests.k8s.text_step_pod_definitions import SPEC

pytestmark = pytest.mark.slow

PREFIX = "datasets/notes/shards/"


def _write_corpus(home: Path) -> None:
    for rel, text in _txt_corpus(range(100)).items():
        path = home / "platform" / "sources" / rel.replace("toy/", "notes/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _execute(instance: dg.DagsterInstance) -> dg.ExecutionResult:
    from tests.k8s import text_step_pod_definitions

    job = dg.reconstructable(text_step_pod_definitions.notes_job)
    job = job._replace(repository=job.repository._replace(container_image=IMAGE))
    return dg.execute_job(job, instance=instance, raise_on_error=False)


def _group_pods(cluster: StepPodCluster) -> list:
    return [p for p in cluster.pods.values() if "_shard_parts[" in p.step_key]


def _published_equals_a_single_step_build(home: Path) -> dict:
    store = _store(home)
    manifest = json.loads(store.get_object("main", PREFIX + "manifest.json"))
    raw = store.download("main", "datasets/notes/raw/documents.parquet", home / "check" / "documents.parquet")
    single = TEXT.shard(SPEC, raw, home / "check" / "single", salt=part_salt(manifest[DATA_KEY]))
    assert {k: v for k, v in manifest.items() if k not in ("source_commit", "location", DATA_KEY)} == single
    for path in [e["path"] for i in single["splits"].values() for e in i["shards"]] + single["files"]:
        assert store.get_object("main", PREFIX + path) == (home / "check" / "single" / path).read_bytes(), path
    return manifest


def test_each_text_group_runs_in_a_pod_of_its_own_and_the_version_is_one_commit(step_pods):
    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    _write_corpus(home)

    with _execute(instance) as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        steps = {e.step_key for e in result.all_events if e.is_step_success}
    cluster.wait()

    assert {p.step_key for p in cluster.pods.values()} == steps  # every step in a Job of its own
    groups = _group_pods(cluster)
    assert all(p.exit_code == 0 for p in cluster.pods.values())
    assert len({p.proc.pid for p in cluster.pods.values()}) == len(cluster.pods)
    (container,) = cluster.manifests[groups[0].job]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE and container["args"][:3] == ["dagster", "api", "execute_step"]

    manifest = _published_equals_a_single_step_build(home)
    assert len(groups) == -(-len(manifest["parts"]) // 2) >= 2 and manifest["tokenizer"]["kind"] == "bpe"
    store = _store(home)
    wrote_shards = [c for c in store.log("main") if len(c.parents) == 1
                    and store.diff(c.parents[0], c.id, prefix=PREFIX)]
    assert len(wrote_shards) == 1, [c.message for c in wrote_shards]


def test_a_text_group_whose_pod_dies_is_retried_alone_in_a_new_pod(step_pods):
    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    _write_corpus(home)
    killed: list[str] = []

    def kill_first_group_pod(pod) -> None:  # a node lost under the step's pod, once it has started
        if "_shard_parts[" in pod.step_key and not killed:
            killed.append(pod.job)
            threading.Timer(1.0, StepPodCluster.end, args=(pod, signal.SIGKILL, 0.0)).start()

    cluster.on_start = kill_first_group_pod
    with _execute(instance) as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
    cluster.wait()

    lost = cluster.pods[killed[0]]
    assert lost.exit_code == -signal.SIGKILL
    again = [p for p in _group_pods(cluster) if p.step_key == lost.step_key]
    assert len(again) == 2 and again[1].exit_code == 0 and restarted == [lost.step_key]
    others = [p.step_key for p in cluster.pods.values() if p.step_key != lost.step_key]
    assert len(others) == len(set(others))  # the other steps ran once each
    _published_equals_a_single_step_build(home)
