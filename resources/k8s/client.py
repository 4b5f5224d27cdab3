"""The small I/O part: submit one launch's manifests, watch them, delete them in `finally`.

Everything it decides (is a request feasible, why is a pod Pending, did the Job fail) is a pure
function in `feasibility.py`; this module only calls the API and sleeps.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from kubernetes.client import BatchV1Api, CoreV1Api, V1Node, V1Pod
from kubernetes.client.exceptions import ApiException

from resources.k8s.feasibility import (
    PodStuckPending,
    failure_summary,
    job_outcome,
    pending_reason,
    pods_not_started,
    terminal_waiting_reason,
)
from resources.k8s.kueue import is_suspended
from resources.k8s.manifests import INDEX_ANNOTATION, JOB_LABEL, TRAINER_CONTAINER

log = logging.getLogger(__name__)


class TrainingJobFailed(RuntimeError):
    """The training Job ended in the Failed condition."""


class TrainingJobClient:
    def __init__(
        self,
        batch_api: BatchV1Api,
        core_api: CoreV1Api,
        *,
        poll_interval_s: float = 5.0,
        pending_timeout_s: float = 600.0,
        deletion_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.batch_api = batch_api
        self.core_api = core_api
        self.poll_interval_s = poll_interval_s
        self.pending_timeout_s = pending_timeout_s
        self.deletion_timeout_s = deletion_timeout_s
        self._clock = clock
        self._sleep = sleep

    def list_nodes(self) -> list[V1Node]:
        try:
            return list(self.core_api.list_node().items)
        except ApiException as exc:
            if exc.status == 403:
                raise PermissionError(
                    "listing nodes is forbidden for this service account, so the GPU "
                    "feasibility check cannot run: install helm/model-factory with "
                    "rbac.nodeReader.enabled=true, or set check_feasibility=False on "
                    "KubernetesTrainingLauncher."
                ) from exc
            raise

    def replace_previous(self, name: str, namespace: str, *, say: Callable[[str], None] | None = None) -> bool:
        """Make sure no Job of this name, and none of its pods, exists; True when one had to go.

        The Job name is fixed per training (root run and asset, ops/training_config.py), so a Job
        found here is an earlier attempt's on the same checkpoint directory: a step pod killed
        before its `finally` ran, or a re-executed run. We replace it rather than adopt it:
        adopting would watch pods started with the earlier attempt's config (a retry may carry new
        overrides or a fixed image) and report through the earlier attempt's Pipes session, whose
        messages this step cannot read; replacing loses at most the steps since the last
        checkpoint, because the new pods resume from it. Foreground deletion removes the pods
        before the Job, and we wait until both are gone (a terminating pod may still be writing a
        checkpoint) so two Jobs never run on one checkpoint directory."""
        found = self._job_exists(name, namespace)
        if found:
            (say or log.info)(f"Job {namespace}/{name} of an earlier attempt exists: deleting it and its pods "
                              "before this attempt starts (it resumes from the same checkpoints)")
            self._delete_ignoring_absent(
                self.batch_api.delete_namespaced_job, name, namespace, propagation_policy="Foreground"
            )
        # Also when the Job object is gone: its pods may still be terminating.
        deadline = self._clock() + self.deletion_timeout_s
        removed = found
        while True:
            job_left = self._job_exists(name, namespace)
            pods_left = [p.metadata.name for p in self.pods(name, namespace)]
            removed = removed or bool(pods_left)
            if not job_left and not pods_left:
                return removed
            if self._clock() >= deadline:
                raise TimeoutError(
                    f"Job {namespace}/{name} of an earlier attempt is still being deleted after "
                    f"{self.deletion_timeout_s:.0f}s (pods left: {pods_left or 'none'}); starting "
                    "another would run two trainings on one checkpoint directory. Fix: see "
                    f"`kubectl -n {namespace} describe job {name}` (a finalizer or a stuck node), "
                    "delete it, then retry the step."
                )
            self._sleep(self.poll_interval_s)

    def _job_exists(self, name: str, namespace: str) -> bool:
        try:
            self.batch_api.read_namespaced_job_status(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def image_ids(self, name: str, namespace: str) -> dict[str, str]:
        """The trainer container's imageID per pod (the digest the node actually ran), for pods
        whose container has started."""
        ids: dict[str, str] = {}
        for pod in self.pods(name, namespace):
            for status in (pod.status.container_statuses or []) if pod.status else []:
                if status.name == TRAINER_CONTAINER and status.image_id:
                    ids[pod.metadata.name] = status.image_id
        return ids

    @contextmanager
    def launched(
        self, manifests: Sequence[dict[str, Any]], *, before_delete: Callable[[str], None] | None = None
    ) -> Iterator[str]:
        """Create the Job (then the Service, owned by it); always delete both on exit.

        Exiting covers success, failure, a raised timeout and a cancelled run (Dagster raises
        in the step process on termination), so nothing is left running; the Job's
        ttlSecondsAfterFinished and the Service's owner reference cover a killed step pod.
        ``before_delete(job name)`` runs first on every exit, while the pods and their logs still
        exist; the Job is deleted even when it raises."""
        job = manifests[0]
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        try:
            created = self.batch_api.create_namespaced_job(namespace, job)
        except ApiException as exc:
            if exc.status == 409:
                # Another attempt created it between replace_previous and here: never run both.
                raise RuntimeError(
                    f"Job {namespace}/{name} already exists: another attempt of this training started "
                    "at the same time. Fix: let one attempt finish (or cancel it), then retry."
                ) from exc
            raise
        services: list[str] = []
        pods: list[str] = []
        try:
            for service in manifests[1:]:  # the Services (and an elastic gang's rendezvous store Pod)
                service["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": created.metadata.uid,
                        "controller": False,
                        "blockOwnerDeletion": False,
                    }
                ]
                if service["kind"] == "Pod":
                    self.core_api.create_namespaced_pod(namespace, service)
                    pods.append(service["metadata"]["name"])
                else:
                    self.core_api.create_namespaced_service(namespace, service)
                    services.append(service["metadata"]["name"])
            yield name
        finally:
            try:
                if before_delete is not None:
                    before_delete(name)
            finally:
                self.delete(name, namespace, services, pods)

    def delete(self, name: str, namespace: str, services: Sequence[str] = (), pods: Sequence[str] = ()) -> None:
        for service in services:
            self._delete_ignoring_absent(self.core_api.delete_namespaced_service, service, namespace)
        for pod in pods:
            self._delete_ignoring_absent(self.core_api.delete_namespaced_pod, pod, namespace)
        # Background propagation deletes the pods too (the default for Jobs orphans them).
        self._delete_ignoring_absent(
            self.batch_api.delete_namespaced_job, name, namespace, propagation_policy="Background"
        )

    @staticmethod
    def _delete_ignoring_absent(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except ApiException as exc:
            # 404: already gone (TTL controller or garbage collector was first); nothing to do.
            if exc.status != 404:
                raise

    def pods(self, name: str, namespace: str) -> list[V1Pod]:
        return list(
            self.core_api.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}").items
        )

    def container_logs(self, name: str, namespace: str) -> dict[str, bytes]:
        """Each pod's log of the Job, every container's, by ``<pod>/<container>.log``; a container
        that restarted adds its previous run's as ``<pod>/<container>.previous.log``. Containers that
        never started have none and are left out. Timestamped, as ``kubectl logs --timestamps``."""
        logs: dict[str, bytes] = {}
        for pod in self.pods(name, namespace):
            status = pod.status
            statuses = [*(status.init_container_statuses or []), *(status.container_statuses or [])] if status else []
            for container in statuses:
                runs = [("log", False)] + ([("previous.log", True)] if container.restart_count else [])
                for suffix, previous in runs:
                    text = self._container_log(pod.metadata.name, namespace, container.name, previous)
                    if text is not None:
                        logs[f"{pod.metadata.name}/{container.name}.{suffix}"] = text
        return logs

    def _container_log(self, pod: str, namespace: str, container: str, previous: bool) -> bytes | None:
        try:
            # Raw bytes: with preloaded content the client would decode, and turn a log that happens
            # to be one JSON document into a Python dict's repr.
            response = self.core_api.read_namespaced_pod_log(
                pod, namespace, container=container, previous=previous, timestamps=True,
                _preload_content=False,
            )
        except ApiException as exc:
            # 400: the container is still waiting (or has no previous run); 404: the pod is gone.
            if exc.status in (400, 404):
                return None
            raise
        try:
            return response.data
        finally:
            response.release_conn()

    def wait_started(self, name: str, namespace: str, nodes: int, *, others_may_wait: bool = False) -> list[V1Pod]:
        """Block until every pod of the Job has left Pending; raise with the scheduler's reason
        if one is still Pending after `pending_timeout_s` (or can never start). With
        ``others_may_wait`` (an elastic gang) ``nodes`` started pods are enough: the others join
        when the cluster has room for them."""
        deadline = self._clock() + self.pending_timeout_s
        while True:
            pods = self.pods(name, namespace)
            current = self.batch_api.read_namespaced_job_status(name, namespace)
            outcome = job_outcome(current.status)
            if outcome != "running":
                return pods
            if is_suspended(current):
                # Waiting in its Kueue queue for quota, which may take hours and is no scheduling
                # problem: the Pending timeout counts from admission (Kueue unsuspends the Job).
                deadline = self._clock() + self.pending_timeout_s
                self._sleep(self.poll_interval_s)
                continue
            pending = pods_not_started(pods)
            for pod in pending:
                reason = terminal_waiting_reason(pod)
                if reason:
                    raise PodStuckPending(f"pod {pod.metadata.name} cannot start: {reason}")
            if len(pods) >= nodes and not pending:
                return pods
            if others_may_wait and len(pods) - len(pending) >= nodes:
                return pods
            if self._clock() >= deadline:
                stuck = pending or pods
                details = "\n".join(
                    f"  {p.metadata.name}: {pending_reason(p, self._events(p, namespace))}"
                    for p in stuck
                ) or f"  the Job controller created {len(pods)} of {nodes} pods"
                raise PodStuckPending(
                    f"training Job {name} still has pods Pending after "
                    f"{self.pending_timeout_s:.0f}s:\n{details}\nFix: free or add capacity for "
                    "the request (see the reason), or raise pending_timeout_s on "
                    "KubernetesTrainingLauncher if the cluster autoscaler needs longer."
                )
            self._sleep(self.poll_interval_s)

    def _events(self, pod: V1Pod, namespace: str) -> list[Any]:
        return list(
            self.core_api.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
            ).items
        )

    @staticmethod
    def pod_for_index(pods: Sequence[V1Pod], index: int) -> V1Pod:
        for pod in pods:
            if (pod.metadata.annotations or {}).get(INDEX_ANNOTATION) == str(index):
                return pod
        raise LookupError(f"no pod with completion index {index} among {len(pods)} pods")

    def wait_finished(self, name: str, namespace: str) -> None:
        """Block until the Job is Complete; raise TrainingJobFailed with each pod's exit."""
        while True:
            status = self.batch_api.read_namespaced_job_status(name, namespace).status
            outcome = job_outcome(status)
            if outcome == "succeeded":
                return
            if outcome == "failed":
                raise TrainingJobFailed(
                    f"training Job {name} failed:\n"
                    + failure_summary(status, self.pods(name, namespace))
                )
            self._sleep(self.poll_interval_s)
