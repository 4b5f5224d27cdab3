"""A stand-in API server for Dagster's step Jobs: each Job that ``dagster_k8s``'s
``k8s_job_executor`` creates (one per step, ``dagster-step-<hash>``) runs as a local process from
the Job's own container args and env, as a kubelet would run its one pod.

tests/k8s/local_cluster.py simulates the training Jobs (Indexed Jobs, rendezvous, replacements);
step Jobs are simpler and come from another client: the executor hands ``V1Job`` model objects to
``BatchV1Api.create_namespaced_job`` and only reads the Job's status back (a step's events reach
the run through the instance's event log, not through the pod), so this class answers exactly
those calls. What the kubelet does is done here:
  - env: as the training stand-in's kubelet resolves it (local_cluster.container_env: ``value``
    with `$(VAR)` expansion and ``secretKeyRef`` from ``secrets``; a missing optional key is left
    out, a missing required one keeps the pod waiting as CreateContainerConfigError would);
  - volumes are the host's own folders: the instance ConfigMap the Job mounts at DAGSTER_HOME is
    the test instance's dagster.yaml already there, and the shared volume is the data root;
  - the pod's log is kept beside the pods (``logs/<job>.log``) and its process group is ended
    when the Job is deleted.
Used by tests/k8s/test_step_pods.py with the platform's own executor configuration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, V1Job, V1JobCondition, V1JobStatus, V1ObjectMeta, V1PodList
from kubernetes.client.exceptions import ApiException

from tests.k8s.local_cluster import _not_found  # the API server's 404, as the training Jobs' stand-in answers it
from tests.k8s.local_cluster import container_env  # the kubelet's env resolution, one for both stand-ins


@dataclass
class StepPod:
    job: str
    step_key: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    waiting: str | None = None  # why the container could not start

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


class StepPodCluster:
    """``batch`` and ``core`` are what ``DagsterKubernetesClient.production_client`` is handed.
    ``pods`` holds every step pod created, in order; ``on_start`` (if set) is called with each pod
    right after its process starts (a test's fault injection)."""

    def __init__(self, workdir: Path, *, secrets: dict[str, dict[str, str]] | None = None,
                 path_env: dict[str, str] | None = None):
        self.workdir = workdir
        self.secrets = secrets or {}
        self.path_env = dict(path_env or {})  # what the code-location image's ENV gives (PATH, PYTHONPATH)
        self.pods: dict[str, StepPod] = {}
        self.manifests: dict[str, dict[str, Any]] = {}
        self.on_start = None
        self._lock = threading.Lock()
        self.batch = _BatchApi(self)
        self.core = _CoreApi(self)

    def create(self, body: V1Job | dict, namespace: str) -> V1Job:
        manifest = body if isinstance(body, dict) else ApiClient().sanitize_for_serialization(body)
        name = manifest["metadata"]["name"]
        if manifest["metadata"].get("namespace", namespace) != namespace:
            raise ApiException(status=400, reason=f"namespace {namespace} does not match the Job's")
        with self._lock:
            if name in self.pods:
                raise ApiException(status=409, reason="AlreadyExists")
            (container,) = manifest["spec"]["template"]["spec"]["containers"]
            env, missing = container_env(container, self.secrets, downward={})
            labels = manifest["spec"]["template"]["metadata"].get("labels", {})
            # the step key as Dagster writes it (the dagster/op label holds it sanitised for a label)
            step_key = env.get("DAGSTER_RUN_STEP_KEY") or labels.get("dagster/op", "")
            pod = StepPod(job=name, step_key=step_key, args=list(container.get("args") or []),
                          env=env, log_path=self.workdir / "logs" / f"{name}.log")
            self.pods[name], self.manifests[name] = pod, manifest
        if missing:
            pod.waiting = missing
        else:
            self._start(pod, container)
        return V1Job(metadata=V1ObjectMeta(name=name, namespace=namespace))

    def _start(self, pod: StepPod, container: dict[str, Any]) -> None:
        command = list(container.get("command") or []) + pod.args  # no command: the image has no ENTRYPOINT
        bin_dir = str(Path(sys.executable).parent)  # the image's venv
        path = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
        executable = subprocess.run(["sh", "-c", 'command -v "$0"', command[0]], env={"PATH": path},
                                    capture_output=True, text=True).stdout.strip()
        if not executable:
            pod.waiting = f"{command[0]}: executable file not found in $PATH"
            return
        pod.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = pod.log_path.open("ab")
        env = {"PATH": path, "LANG": "C.UTF-8", "HOSTNAME": pod.job, **self.path_env, **pod.env}
        pod.proc = subprocess.Popen([executable, *command[1:]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=container.get("workingDir") or None)
        log.close()
        if self.on_start is not None:
            self.on_start(pod)

    def status(self, name: str) -> V1JobStatus:
        pod = self.pods[name]
        if pod.waiting is not None:
            return V1JobStatus(active=1)  # the pod stays Pending; the Job neither fails nor finishes
        rc = pod.exit_code
        if rc is None:
            return V1JobStatus(active=1)
        if rc == 0:
            return V1JobStatus(succeeded=1, conditions=[V1JobCondition(type="Complete", status="True")])
        # backoffLimit 0 (dagster-k8s' step Jobs): one failed pod fails the Job
        return V1JobStatus(failed=1, conditions=[V1JobCondition(type="Failed", status="True",
                                                                reason="BackoffLimitExceeded")])

    def delete(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is None:
            raise _not_found("jobs.batch", name)
        self.end(pod)

    @staticmethod
    def end(pod: StepPod, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
        """The kubelet ending the pod: ``sig`` to its process group, SIGKILL after the grace period."""
        if pod.proc is None or pod.proc.poll() is not None:
            return
        try:
            os.killpg(pod.proc.pid, sig)
            pod.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pod.proc.pid, signal.SIGKILL)
            pod.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float = 60.0) -> None:
        """Until every started pod has exited: a step's success reaches the run through the event
        log a moment before its process ends."""
        for pod in self.pods.values():
            if pod.proc is not None:
                pod.proc.wait(timeout=timeout_s)

    def close(self) -> None:
        for pod in list(self.pods.values()):
            self.end(pod, grace_s=5.0)


class _BatchApi:
    def __init__(self, cluster: StepPodCluster):
        self.c = cluster

    def create_namespaced_job(self, namespace: str, body: V1Job | dict, **_: Any) -> V1Job:
        return self.c.create(body, namespace)

    def read_namespaced_job_status(self, name: str, namespace: str, **_: Any) -> V1Job:
        if name not in self.c.pods:
            raise _not_found("jobs.batch", name)
        return V1Job(metadata=V1ObjectMeta(name=name, namespace=namespace), status=self.c.status(name))

    def delete_namespaced_job(self, name: str, namespace: str, **_: Any) -> None:
        self.c.delete(name)


class _CoreApi:
    def __init__(self, cluster: StepPodCluster):
        self.c = cluster

    def list_namespaced_pod(self, namespace: str, **_: Any) -> V1PodList:
        # Pod objects are asked for only on a Job's deletion and to find the executor's own pod
        # (owner references); neither needs more than "none known" here.
        return V1PodList(items=[])

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        return None
