"""An image folder and a table sharded over step pods, as on Kubernetes (issue 41, item 4): the dataset's run
executed by the platform's ``k8s_job_executor`` configuration, each step a Job of its own whose
pod runs ``dagster api execute_step`` from the Job's own args and env (tests/k8s/step_pods.py, a
stand-in for the API server and kubelet). The shard steps run in pods of their own, the version is
published in one commit holding every image once, and a shard step whose pod dies is retried
alone, in a new pod, while the other steps' pods are not started again.

The instance is the production one's shape where it matters to the executor (a K8sRunLauncher
naming the instance ConfigMap, DAGSTER_HOME and the platform's environment) on SQLite, and the
pods share this machine's file system as the pods of a cluster share the instance's database and
the training volume."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
from pathlib import Path

import dagster as dg
import pytest
from dagster_k8s.client import DagsterKubernetesClient

from pipelines.models.shapes import write_shapes_source
from tests.k8s.step_pods import StepPodCluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "model-factory"
IMAGE = "registry.example.com/model-factory/code-location:steps"
KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: sim, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: sim, user: {token: not-used}}]
contexts: [{name: sim, context: {cluster: sim, user: sim}}]
current-context: sim
"""
PLATFORM_ENV = {"TRAINING_NAMESPACE": NAMESPACE, "MODEL_FACTORY_SHARED_CLAIM": "model-factory-shared",
                "TRAINING_IMAGE": "registry.example.com/model-factory/training:steps"}


def _instance_yaml(home: Path) -> str:
    env = [f"{k}={v}" for k, v in PLATFORM_ENV.items()] + [f"PYTHONPATH={REPO}"]
    return textwrap.dedent(f"""\
        run_launcher:
          module: dagster_k8s
          class: K8sRunLauncher
          config:
            service_account_name: dagster
            job_namespace: {NAMESPACE}
            instance_config_map: dagster-instance
            dagster_home: {home}
            load_incluster_config: false
            kubeconfig_file: {home / "kubeconfig"}
            image_pull_policy: IfNotPresent
            env_vars: {json.dumps(env)}
        telemetry:
          enabled: false
        """)


@pytest.fixture
def step_pods(tmp_path, monkeypatch):
    """(the instance, the simulated cluster) with the executor's API client pointed at it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "kubeconfig").write_text(KUBECONFIG)
    (home / "dagster.yaml").write_text(_instance_yaml(home))
    for k, v in {**PLATFORM_ENV, "DAGSTER_HOME": str(home), "KUBECONFIG": str(home / "kubeconfig")}.items():
        monkeypatch.setenv(k, v)
    cluster = StepPodCluster(tmp_path / "pods", secrets={"dagster-postgresql-secret": {"postgresql-password": "-"}})
    original = DagsterKubernetesClient.production_client
    monkeypatch.setattr(DagsterKubernetesClient, "production_client", staticmethod(
        lambda batch_api_override=None, core_api_override=None: original(batch_api_override=cluster.batch,
                                                                          core_api_override=cluster.core)))
    try:
        with dg.DagsterInstance.get() as instance:
            yield instance, cluster
    finally:
        cluster.close()


def _execute(instance: dg.DagsterInstance, job_name: str = "shapes_job") -> dg.ExecutionResult:
    from tests.k8s import step_pod_definitions

    job = dg.reconstructable(getattr(step_pod_definitions, job_name))
    # the image the code server says it runs in (DAGSTER_CURRENT_IMAGE on a user deployment): the
    # executor gives it to every step pod
    job = job._replace(repository=job.repository._replace(container_image=IMAGE))
    return dg.execute_job(job, instance=instance, raise_on_error=False)


def _shard_step_pods(cluster: StepPodCluster) -> list:
    return [p for p in cluster.pods.values() if "_shard_parts[" in p.step_key]


def _store(instance_home: Path):
    from pipelines.profiles import Profile

    return Profile(name="local", data_root=instance_home / "platform").store()


def _version_images(instance_home: Path) -> list[str]:
    from tests.data.test_images import read_shards

    store = _store(instance_home)
    manifest = json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))
    return sorted(i for ids, _, _ in read_shards(store, manifest, instance_home / "read").values() for i in ids)


def test_each_shard_step_runs_in_a_pod_of_its_own_and_the_version_is_one_commit(step_pods, tmp_path):
    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    folder = write_shapes_source(home / "platform" / "sources", per_class=40, seed=3)

    with _execute(instance) as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        steps = {e.step_key for e in result.all_events if e.is_step_success}
    cluster.wait()

    # every step of the run ran in a Job of its own, from the executor's manifest
    assert {p.step_key for p in cluster.pods.values()} == steps
    shard_pods = _shard_step_pods(cluster)
    assert len(shard_pods) >= 2 and all(p.exit_code == 0 for p in cluster.pods.values())
    manifest = cluster.manifests[shard_pods[0].job]
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE and container["args"][:3] == ["dagster", "api", "execute_step"]
    assert manifest["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000  # the platform's step config
    assert len({p.proc.pid for p in cluster.pods.values()}) == len(cluster.pods)  # a process each

    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    assert _version_images(home) == files
    # the steps staged their files; one commit (not a merge) brought the shards into the history
    store = _store(home)
    wrote_shards = [c for c in store.log("main") if len(c.parents) == 1
                    and store.diff(c.parents[0], c.id, prefix="datasets/shapes/shards/")]
    assert len(wrote_shards) == 1, [c.message for c in wrote_shards]


def test_a_shard_step_whose_pod_dies_is_retried_alone_in_a_new_pod(step_pods):
    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    folder = write_shapes_source(home / "platform" / "sources", per_class=40, seed=3)
    killed: list[str] = []

    def kill_first_shard_pod(pod) -> None:  # a node lost under the step's pod, once it has started
        if "_shard_parts[" in pod.step_key and not killed:
            killed.append(pod.job)
            threading.Timer(1.0, StepPodCluster.end, args=(pod, signal.SIGKILL, 0.0)).start()

    cluster.on_start = kill_first_shard_pod
    with _execute(instance) as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
    cluster.wait()

    shard_pods = _shard_step_pods(cluster)
    lost = cluster.pods[killed[0]]
    assert lost.exit_code == -signal.SIGKILL
    again = [p for p in shard_pods if p.step_key == lost.step_key]
    assert len(again) == 2 and again[1].exit_code == 0 and restarted == [lost.step_key]
    # the other steps ran once each
    others = [p.step_key for p in cluster.pods.values() if p.step_key != lost.step_key]
    assert len(others) == len(set(others))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    assert _version_images(home) == files


def test_a_tables_groups_of_parts_run_in_pods_of_their_own_and_publish_one_commit(step_pods, tmp_path):
    from tests.k8s.step_pod_definitions import LEDGER
    from tests.pipeline.test_table_shard_steps import _frame, _published_equals_a_single_step_build, _write

    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    _write(home / "platform" / "sources", "ledger/table.csv", _frame(range(240)))

    with _execute(instance, "ledger_job") as result:
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        steps = {e.step_key for e in result.all_events if e.is_step_success}
    cluster.wait()

    assert {p.step_key for p in cluster.pods.values()} == steps  # the plan and publish too: a pod each
    shard_pods = _shard_step_pods(cluster)
    assert len(shard_pods) >= 2 and all(p.exit_code == 0 for p in cluster.pods.values())
    store = _store(home)
    manifest = _published_equals_a_single_step_build(store, LEDGER, tmp_path / "check")
    assert len(shard_pods) == -(-len(manifest["parts"]) // 2)
    wrote_shards = [c for c in store.log("main") if len(c.parents) == 1
                    and store.diff(c.parents[0], c.id, prefix="datasets/ledger/shards/")]
    assert len(wrote_shards) == 1, [c.message for c in wrote_shards]


def test_a_tables_shard_step_whose_pod_dies_is_retried_alone_and_the_version_is_whole(step_pods, tmp_path):
    retried_alone, whole, why = table_step_pod_killed(step_pods, tmp_path)
    assert retried_alone, why
    assert whole, why


def table_step_pod_killed(step_pods, tmp_path) -> tuple[bool, bool, str]:
    """(the killed step was retried alone in a new pod and the others ran once, main's version is
    the single-step build, what went otherwise): a table's first shard step pod is SIGKILLed a
    second after it starts. tests/reliability/test_data_faults.py records it as a class too."""
    from tests.k8s.step_pod_definitions import LEDGER
    from tests.pipeline.test_table_shard_steps import _frame, _published_equals_a_single_step_build, _write

    instance, cluster = step_pods
    home = Path(os.environ["DAGSTER_HOME"])
    _write(home / "platform" / "sources", "ledger/table.csv", _frame(range(240)))
    killed: list[str] = []

    def kill_first_shard_pod(pod) -> None:  # a node lost under the step's pod, once it has started
        if "_shard_parts[" in pod.step_key and not killed:
            killed.append(pod.job)
            threading.Timer(1.0, StepPodCluster.end, args=(pod, signal.SIGKILL, 0.0)).start()

    cluster.on_start = kill_first_shard_pod
    with _execute(instance, "ledger_job") as result:
        failures = [e.message for e in result.all_events if e.is_failure]
        restarted = [e.step_key for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]
        success = result.success
    cluster.wait()
    if not success or not killed:
        return False, False, f"run failed: {failures}" if not success else "no shard step pod started"
    lost = cluster.pods[killed[0]]
    again = [p for p in _shard_step_pods(cluster) if p.step_key == lost.step_key]
    others = [p.step_key for p in cluster.pods.values() if p.step_key != lost.step_key]
    alone = (lost.exit_code == -signal.SIGKILL and len(again) == 2 and again[1].exit_code == 0
             and restarted == [lost.step_key] and len(others) == len(set(others)))
    try:
        _published_equals_a_single_step_build(_store(home), LEDGER, tmp_path / "check")
        whole = True
    except AssertionError as exc:
        whole = False
        failures.append(str(exc)[:500])
    return alone, whole, f"lost {lost.step_key} (exit {lost.exit_code}), its pods {[p.exit_code for p in again]}, " \
                         f"restarted {restarted}; {failures}"
