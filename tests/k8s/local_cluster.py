"""A stand-in for the API server and kubelets: each pod of a created Indexed Job runs as a local
process, from the manifest's own command and env.

It implements the handful of BatchV1Api / CoreV1Api calls the launcher makes and answers with
the kubernetes client's real model objects, so the launcher, dagster-k8s's pod-log Pipes reader
and the torchrun wiring run unchanged. What a kubelet and cluster DNS would do is done here:
  - env: `value`, `fieldRef` to the completion-index annotation, the pod's name and its node's
    (the cluster's nodes in turn), `secretKeyRef` from `secrets`
    (a missing non-optional key leaves the pod waiting in CreateContainerConfigError);
  - `$(VAR)` in the command is expanded from the container's env, as the kubelet does;
  - the pods' stable DNS names `<job>-<i>.<svc>.<ns>.svc.<domain>` resolve to 127.0.0.<i+1>
    (all of 127/8 is loopback, so each "pod" keeps an address of its own);
  - logs are prefixed with RFC 3339 timestamps, as `kubectl logs --timestamps` returns them;
    read whole (not followed) they come back as the raw response `_preload_content=False` gives,
    and a pod's log is gone once its Job is deleted.
A test stands in for a kubelet that restarted a container by setting `LocalPod.previous_log`.

An elastic gang's Job (``backoffLimitPerIndex`` set) gets the Job controller's per-index policy: a
pod that fails or is deleted (SIGTERM, then SIGKILL after the grace period, its whole process
tree, as a kubelet ends a pod's containers) is replaced in its index ``replacement_delay_s`` later
(the time the cluster takes to find room again), at most ``backoffLimitPerIndex`` times; the
first pod that succeeds completes the Job and ends the others (``successPolicy``). Bare pods (an
elastic gang's rendezvous store) run the same way, with ``image_env`` standing in for what the
image provides, and go with the Job that owns them.

**Image mode.** With ``image`` (default: the environment variable ``POD_SIM_IMAGE``, an image in
buildah's store such as ``make images`` builds: ``test-artifacts/images.json`` names it) every pod,
a bare one too, runs inside that image's root file system instead of as a process of this checkout
(tests/k8s/image_root.py: a working container per pod, ``buildah mount`` and ``chroot``; no
container runtime works here). As a kubelet would: the image's ENV under the pod's env, its
WORKDIR, the securityContext's runAsUser/runAsGroup with fsGroup as a supplementary group, the root
read-only where readOnlyRootFilesystem says so, each emptyDir a fresh tmpfs at its mountPath, and a
persistentVolumeClaim the host folder at its mountPath (the tests' shared folder has the same path
in the step and in the pods), its files given to fsGroup as the kubelet does at each mount. What a
test sets in the pod's env to stand in for the image in process mode (``IMAGE_STAND_INS``:
PYTHONPATH at this checkout, a BUILD.json of its own) is left out, the image's own serving instead;
a test instrument's folder (``INSTRUMENT_FOLDERS``: the soak's Pipes ledger) is bound in at its
path. Pods are still processes of this host (no PID namespace), so deletion and node loss signal
them as before. Without an image, or when the one named cannot be run here, pods run as processes
and the cluster logs why (``image_note``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from kubernetes.client import (
    CoreV1Event,
    CoreV1EventList,
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1Node,
    V1NodeList,
    V1ObjectMeta,
    V1ObjectReference,
    V1Pod,
    V1PodCondition,
    V1PodList,
    V1PodStatus,
)
from kubernetes.client.exceptions import ApiException

from resources.k8s.manifests import INDEX_ANNOTATION, TRAINER_CONTAINER as CONTAINER
from tests.k8s.image_root import ImageRoot, image_inspect, tools_missing
from training_runtime.observe.build_info import BUILD_INFO_ENV
from training_runtime.observe.pipes import LEDGER_ENV

log = logging.getLogger(__name__)

# The switch: an image reference (buildah's store) the pods run in; unset, they run as processes.
POD_IMAGE_ENV = "POD_SIM_IMAGE"
# Env a test sets so that a bare process looks like the image (its code, its BUILD.json): in image
# mode the image's own are used, and a value pointing outside the pod's volumes is left out.
IMAGE_STAND_INS = ("PYTHONPATH", BUILD_INFO_ENV)
# Env naming a host folder a test reads back what the pods wrote: bound into the pod at its path.
INSTRUMENT_FOLDERS = (LEDGER_ENV,)
_FROM_ENV = object()


class PodImageFallback(UserWarning):
    """POD_SIM_IMAGE named an image the pods cannot run in here; they ran as processes
    (``make test-images`` turns this into an error: there the image must be used)."""


_said: set[str] = set()  # the fallback is logged once per process and reason, not at every cluster


def pod_image(requested: str | None) -> tuple[str | None, str]:
    """The image pods can run in, or None and why not (a sentence naming the fix)."""
    if not requested:
        return None, (f"{POD_IMAGE_ENV} is not set: pods run as local processes of this checkout's .venv, not the "
                      f"image's contents (make images, then {POD_IMAGE_ENV}=<image> from test-artifacts/images.json)")
    why = tools_missing() or (None if os.geteuid() == 0 else "running pods in an image needs root (buildah mount, chroot)")
    if why is None and subprocess.run(["buildah", "inspect", "--type", "image", requested],
                                      capture_output=True).returncode != 0:
        why = "buildah's store has no such image (make images builds it; test-artifacts/images.json names it)"
    if why:
        return None, f"{POD_IMAGE_ENV}={requested} cannot be run here: {why}; pods run as local processes instead"
    return requested, ""

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: defined names are replaced, `$$` escapes, rest stays."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def container_env(container: dict[str, Any], secrets: dict[str, dict[str, str]],
                  downward: dict[str, str]) -> tuple[dict[str, str], str]:
    """A container's env as the kubelet resolves it: values with `$(VAR)` expansion, the fieldRefs
    in ``downward`` (field path -> value), and secretKeyRef from ``secrets`` (a missing optional key
    is left out). Returns (env, "") or, where a required Secret key is missing, (the env so far, the
    kubelet's CreateContainerConfigError message): the pod then waits, as it would on a cluster."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "valueFrom" not in entry:
            env[entry["name"]] = expand(entry.get("value") or "", env)  # the API allows no value: ""
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in downward:
                raise ValueError(f"the local pod simulator resolves only the fieldRefs {sorted(downward)}, not {path}")
            env[entry["name"]] = downward[path]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets.get(ref["name"], {}).get(ref["key"])
            if value is None:
                if ref.get("optional"):
                    continue
                return env, f'couldn\'t find key {ref["key"]} in Secret {ref["name"]}'
            env[entry["name"]] = value
        else:
            raise ValueError(f"the local pod simulator resolves only values, fieldRefs and secretKeyRef, not {source}")
    if container.get("envFrom"):
        raise ValueError(f"the local pod simulator does not resolve envFrom {container['envFrom']}")
    return env, ""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LocalPod:
    name: str
    index: int
    labels: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    waiting: tuple[str, str] | None = None  # (reason, message) while it cannot start
    pump: threading.Thread | None = None
    previous_log: bytes | None = None  # the container's run before a restart, if it had one
    root: ImageRoot | None = None  # image mode: the pod's container root, removed once it exits

    @property
    def phase(self) -> str:
        if self.proc is None:
            return "Pending"
        rc = self.proc.poll()
        if rc is None:
            return "Running"
        return "Succeeded" if rc == 0 else "Failed"


@dataclass
class LocalJob:
    manifest: dict[str, Any]
    uid: str
    pods: list[LocalPod] = field(default_factory=list)
    failures: dict[int, int] = field(default_factory=dict)  # index -> its pods that failed or were deleted
    replace_at: dict[int, float] = field(default_factory=dict)  # index -> when its replacement starts

    @property
    def per_index(self) -> bool:
        return "backoffLimitPerIndex" in self.manifest["spec"]


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts its workers in sessions of their own,
    so a process group does not reach them; a pod's cgroup does)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def signal_tree_when(find: Callable[[], tuple[str, int] | None], sig: int, timeout_s: float) -> list[str]:
    """A fault the elastic tests inject once: a daemon thread polls ``find`` until it names
    (label, pid), a pod or a node that has reached the moment to lose it, then sends ``sig`` to
    every process of that pid's tree (what the kubelet, or a lost machine, ends) and appends the
    label to the list returned, which stays empty if the moment never came within ``timeout_s``."""
    done: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = find()
            if found is not None:
                label, pid = found
                for p in process_tree(pid):
                    try:
                        os.kill(p, sig)
                    except ProcessLookupError:
                        continue
                done.append(label)
                return
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    return done


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


class LocalCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        secrets: dict[str, dict[str, str]] | None = None,
        nodes: list[V1Node] | None = None,
        schedulable: bool = True,
        image_id: str = "",
        replacement_delay_s: float = 0.0,
        image_env: dict[str, str] | None = None,
        grace_s: float = 30.0,
        image: str | None | object = _FROM_ENV,
        image_extras: tuple[tuple[Path, str], ...] = (),
    ):
        """``image``: run every pod inside this image (see the module's "Image mode"); by
        default the environment's ``POD_SIM_IMAGE``; None: processes, whatever the environment.
        ``image_extras``: (host folder, path) pairs bound into every pod's root in image mode,
        what a team's own build of the image adds (USER_CODE) for a test whose training function
        lives in this checkout; process mode has them on PYTHONPATH already."""
        self.image_extras = tuple(image_extras)
        self.rooted: list[LocalPod] = []  # image mode: every pod started, until its root is released
        requested = os.environ.get(POD_IMAGE_ENV) if image is _FROM_ENV else image
        self.image, self.image_note = pod_image(requested)  # type: ignore[arg-type]
        if self.image is None and self.image_note not in _said:
            _said.add(self.image_note)
            log.warning("pod simulation: %s", self.image_note)
            if requested:  # asked for and not given: a warning the test run's summary shows
                warnings.warn(f"pod simulation: {self.image_note}", PodImageFallback, stacklevel=2)
        if self.image is not None and not image_id:
            # what a kubelet reports for a pulled image: the reference and its digest
            image_id = f"{self.image.split('@')[0]}@{image_inspect(self.image)['FromImageDigest']}"
        self.replacement_delay_s = replacement_delay_s
        self.image_env = dict(image_env or {})
        self.grace_s = grace_s
        self.bare_pods: dict[str, tuple[LocalPod, dict[str, Any]]] = {}
        self.workdir = workdir
        self.image_id = image_id  # what the containers' status reports as the image digest run
        self.secrets = secrets or {}
        self.nodes = nodes or []
        self.schedulable = schedulable
        self.jobs: dict[str, LocalJob] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []  # what was created / deleted, in order
        self.batch = _BatchApi(self)
        self.core = _CoreApi(self)

    # -- pods ------------------------------------------------------------------------------
    def _start_pods(self, job: LocalJob) -> None:
        for index in range(job.manifest["spec"]["completions"]):
            self._start_pod(job, index)

    def _start_pod(self, job: LocalJob, index: int) -> LocalPod:
        template = job.manifest["spec"]["template"]
        name = job.manifest["metadata"]["name"]
        earlier = sum(p.index == index for p in job.pods)  # a replacement logs apart from its predecessor
        pod = LocalPod(
            name=f"{name}-{index}-{uuid.uuid4().hex[:5]}",
            index=index,
            labels=dict(template["metadata"]["labels"]),
            log_path=self.workdir / (f"{name}-{index}.log" if not earlier else f"{name}-{index}.{earlier}.log"),
        )
        job.pods.append(pod)
        if not self.schedulable:
            return pod
        (container,) = template["spec"]["containers"]
        env, missing = self._container_env(container, index, pod.name, self._node_for(index))
        if missing:
            pod.waiting = ("CreateContainerConfigError", missing)
            return pod
        command = [self._rewrite_dns(job, expand(a, env)) for a in container["command"]]
        env = {k: self._rewrite_dns(job, v) for k, v in env.items()}
        if self.image is not None:
            self._spawn_in_image(pod, template["spec"], container, command, env)
        else:
            pod.proc, pod.pump = self._spawn(command, env, pod.log_path)
        return pod

    def _end_pod(self, pod: LocalPod) -> None:
        """A kubelet ending a pod: SIGTERM to every process of it, SIGKILL after the grace period."""
        if pod.proc is None or pod.proc.poll() is not None:
            return
        tree = process_tree(pod.proc.pid)
        _signal_all(tree, 15)
        try:
            pod.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_all(process_tree(pod.proc.pid) + tree, 9)
        pod.proc.wait(timeout=10)

    def delete_pod(self, pod_name: str) -> None:
        """The API server's pod deletion: the pod ends and leaves the list. A Job's index gets a
        replacement as for a failed pod (the controller counts a deleted pod as failed)."""
        for job in self.jobs.values():
            for pod in list(job.pods):
                if pod.name == pod_name:
                    self._end_pod(pod)
                    job.pods.remove(pod)
                    self.calls.append(f"delete Pod {pod_name}")
                    if job.per_index:
                        self._index_failed(job, pod.index)
                    return
        if pod_name in self.bare_pods:
            self._end_pod(self.bare_pods.pop(pod_name)[0])
            self.calls.append(f"delete Pod {pod_name}")
            return
        raise _not_found("pods", pod_name)

    def _index_failed(self, job: LocalJob, index: int) -> None:
        job.failures[index] = job.failures.get(index, 0) + 1
        if job.failures[index] <= job.manifest["spec"]["backoffLimitPerIndex"]:
            job.replace_at[index] = time.monotonic() + self.replacement_delay_s

    def _start_bare_pod(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        (container,) = body["spec"]["containers"]
        env, _ = self._container_env(container, 0, name)
        pod = LocalPod(name=name, index=0, labels=dict(body["metadata"].get("labels", {})),
                       log_path=self.workdir / f"{name}.log")
        command = [expand(a, env) for a in container["command"]]
        if self.image is not None:  # the image's ENV is what image_env stands in for
            self._spawn_in_image(pod, body["spec"], container, command, env)
        else:
            pod.proc, pod.pump = self._spawn(command, {**self.image_env, **env}, pod.log_path)
        self.bare_pods[name] = (pod, body)

    def _node_for(self, index: int) -> str:
        """The node a pod "runs on": the cluster's nodes in turn (for the downward API's spec.nodeName)."""
        return self.nodes[index % len(self.nodes)].metadata.name if self.nodes else "local-node"

    def _container_env(self, container: dict[str, Any], index: int, pod_name: str = "",
                       node_name: str = "local-node") -> tuple[dict[str, str], str]:
        downward = {f"metadata.annotations['{INDEX_ANNOTATION}']": str(index), "metadata.name": pod_name,
                    "spec.nodeName": node_name}
        return container_env(container, self.secrets, downward)

    @staticmethod
    def _rewrite_dns(job: LocalJob, text: str) -> str:
        name = job.manifest["metadata"]["name"]
        ns = job.manifest["metadata"]["namespace"]
        subdomain = job.manifest["spec"]["template"]["spec"].get("subdomain")
        # an elastic gang's rendezvous store Service (its pod listens on every loopback address)
        text = re.sub(rf"{re.escape(name[:58].rstrip('-'))}-rdzv\.{re.escape(ns)}\.svc(\.[a-z0-9.-]+)?", "127.0.0.254",
                      text)
        if not subdomain:
            return text
        pattern = re.compile(rf"{re.escape(name)}-(\d+)\.{re.escape(subdomain)}\.{re.escape(ns)}\.svc(\.[a-z0-9.-]+)?")
        return pattern.sub(lambda m: f"127.0.0.{int(m.group(1)) + 1}", text)

    @staticmethod
    def _spawn(command: list[str], env: dict[str, str], log_path: Path):
        bin_dir = str(Path(sys.executable).parent)
        path = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
        executable = shutil.which(command[0], path=path)
        if executable is None:
            raise FileNotFoundError(f"{command[0]} not on {path}")
        proc_env = {"PATH": path, "LANG": "C.UTF-8", **env}
        proc = subprocess.Popen(
            [executable, *command[1:]], env=proc_env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        return proc, _pump(proc, log_path)

    # -- image mode ------------------------------------------------------------------------
    def _spawn_in_image(self, pod: LocalPod, spec: dict[str, Any], container: dict[str, Any], command: list[str],
                        env: dict[str, str]) -> None:
        """The pod's container inside the image: its own working container of it, the pod's
        volumes and user; the root is released once the container's processes are gone."""
        pod_sc, ctr_sc = spec.get("securityContext") or {}, container.get("securityContext") or {}
        uid = ctr_sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = ctr_sc.get("runAsGroup", pod_sc.get("runAsGroup", uid))
        fs_group = pod_sc.get("fsGroup")
        tmpfs, binds = self._pod_volumes(spec, container, fs_group)
        env, dropped, instruments = self._image_env(env, [inside for _, inside in binds] + tmpfs)
        binds += [(Path(folder), folder) for folder in instruments] + list(self.image_extras)
        root = ImageRoot.open(self.image, name=f"podsim-{pod.name}")
        try:
            root.mount_pod(tmpfs=tmpfs, binds=binds, read_only_root=bool(ctr_sc.get("readOnlyRootFilesystem")))
            user = None if uid is None else f"{uid}:{gid}"
            argv = root.argv(command, env, user=user, groups=[fs_group] if fs_group is not None else [])
            pod.root = root
            pod.proc, pod.pump = self._spawn_argv(argv, pod.log_path, after=root.close)
            self.rooted.append(pod)
        except BaseException:
            root.close()
            raise
        note = f"pod simulation: pod {pod.name} runs in image {self.image} as {user or 'its USER'}"
        if dropped:
            note += f", without {', '.join(dropped)} (host stand-ins for what the image holds)"
        log.info(note)

    def _pod_volumes(self, spec: dict[str, Any], container: dict[str, Any],
                     fs_group: int | None) -> tuple[list[str], list[tuple[Path, str]]]:
        """(tmpfs mount paths, (host folder, mount path) binds) for the container's volumeMounts."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        tmpfs, binds = [], []
        for mount in container.get("volumeMounts", []):
            volume, path = volumes[mount["name"]], mount["mountPath"]
            if "emptyDir" in volume:
                tmpfs.append(path)
            elif "persistentVolumeClaim" in volume:
                host = Path(path)
                if not host.is_dir():
                    raise FileNotFoundError(
                        f"the pod simulation stands the PVC {volume['persistentVolumeClaim']['claimName']} for the host "
                        f"folder at its mountPath {path}, which does not exist: create it (the step's shared folder)")
                if fs_group is not None:
                    give_to_group(host, fs_group)
                binds.append((host, path))
            else:
                raise ValueError(f"the pod simulation mounts emptyDir and persistentVolumeClaim volumes only, not {volume}")
        return tmpfs, binds

    @staticmethod
    def _image_env(env: dict[str, str], volumes: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
        """The pod's env less the host stand-ins that point outside its volumes; the instrument
        folders to bind in."""
        inside = lambda p: any(Path(p).is_relative_to(v) for v in volumes)  # noqa: E731
        kept, dropped = dict(env), []
        for name in IMAGE_STAND_INS:
            if name not in kept:
                continue
            parts = [p for p in kept[name].split(os.pathsep) if p and inside(p)]
            if parts:
                kept[name] = os.pathsep.join(parts)
            else:
                dropped.append(f"{name}={kept.pop(name)}")
        instruments = [env[n] for n in INSTRUMENT_FOLDERS if env.get(n) and Path(env[n]).is_dir() and not inside(env[n])]
        return kept, dropped, instruments

    @staticmethod
    def _spawn_argv(argv: list[str], log_path: Path, after=None):
        proc = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, _pump(proc, log_path, after)

    def _kill(self, job: LocalJob) -> None:
        for pod in job.pods:
            if pod.proc and pod.proc.poll() is None:
                os.killpg(pod.proc.pid, 15)
        for pod in job.pods:
            if pod.proc:
                try:
                    pod.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(pod.proc.pid, 9)
                    pod.proc.wait(timeout=10)

    def close(self) -> None:
        for job in list(self.jobs.values()):
            self._kill(job)
        for pod, _ in list(self.bare_pods.values()):
            self._end_pod(pod)
        # image mode: each pod's root goes once its output ends (the pump's last act), deleted
        # Jobs' pods included; a root still held after that is named, not left silently mounted
        held = []
        for pod in self.rooted:
            if pod.pump is not None:
                pod.pump.join(timeout=30)
            if pod.root is not None and pod.root.container:
                held.append(f"{pod.name} ({pod.root.container} at {pod.root.mnt})")
        if held:
            raise RuntimeError(f"pod simulation: image roots still mounted 30 s after close: {', '.join(held)}; "
                               "a process of the pod outlived it (see `buildah containers`, `ps -ef`)")

    # -- API objects ----------------------------------------------------------------------
    def _pod_object(self, pod: LocalPod) -> V1Pod:
        state: V1ContainerState | None
        conditions = None
        phase = pod.phase
        if phase == "Pending":
            if pod.waiting:
                state = V1ContainerState(waiting=V1ContainerStateWaiting(reason=pod.waiting[0], message=pod.waiting[1]))
            else:
                state = None
                conditions = [V1PodCondition(
                    type="PodScheduled", status="False", reason="Unschedulable",
                    message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu. "
                            "preemption: 0/2 nodes are available: 2 No preemption victims found.")]
        elif phase == "Running":
            state = V1ContainerState(running=V1ContainerStateRunning())
        else:
            if pod.pump:
                pod.pump.join(timeout=10)
            tail = pod.log_path.read_text(errors="replace").splitlines()[-20:] if pod.log_path.exists() else []
            state = V1ContainerState(terminated=V1ContainerStateTerminated(
                exit_code=pod.proc.returncode, reason="Completed" if phase == "Succeeded" else "Error",
                message="\n".join(line.partition(" ")[2] for line in tail)))
        statuses = None
        if state is not None:
            statuses = [V1ContainerStatus(name=CONTAINER, image=self.image or "local", image_id=self.image_id,
                                          ready=phase == "Running",
                                          restart_count=0 if pod.previous_log is None else 1, state=state)]
        return V1Pod(
            metadata=V1ObjectMeta(name=pod.name, labels=pod.labels,
                                  annotations={INDEX_ANNOTATION: str(pod.index)}),
            status=V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses),
        )

    def _job_status(self, job: LocalJob) -> V1JobStatus:
        if job.per_index:
            return self._per_index_status(job)
        phases = [p.phase for p in job.pods]
        if "Failed" in phases:
            # backoffLimit 0: the controller fails the Job and stops the other pods.
            self._kill(job)
            return V1JobStatus(failed=phases.count("Failed"), conditions=[V1JobCondition(
                type="Failed", status="True", reason="BackoffLimitExceeded",
                message="Job has reached the specified backoff limit")])
        if phases and all(p == "Succeeded" for p in phases):
            return V1JobStatus(succeeded=len(phases), conditions=[V1JobCondition(type="Complete", status="True")])
        return V1JobStatus(active=sum(p in ("Running", "Pending") for p in phases))

    def _per_index_status(self, job: LocalJob) -> V1JobStatus:
        """backoffLimitPerIndex, maxFailedIndexes, successPolicy succeededCount 1, replacements."""
        spec = job.manifest["spec"]
        for pod in job.pods:
            if pod.phase == "Failed" and not getattr(pod, "counted", False):
                pod.counted = True  # type: ignore[attr-defined]
                self._index_failed(job, pod.index)
        if any(p.phase == "Succeeded" for p in job.pods):
            for pod in job.pods:
                self._end_pod(pod)
            job.replace_at.clear()
            return V1JobStatus(succeeded=1, conditions=[V1JobCondition(type="SuccessCriteriaMet", status="True"),
                                                          V1JobCondition(type="Complete", status="True")])
        failed_for_good = [i for i, n in job.failures.items() if n > spec["backoffLimitPerIndex"]]
        if len(failed_for_good) > spec.get("maxFailedIndexes", 0):
            self._kill(job)
            return V1JobStatus(failed=sum(job.failures.values()), conditions=[V1JobCondition(
                type="Failed", status="True", reason="MaxFailedIndexesExceeded",
                message="Job has exceeded the specified maximal number of failed indexes")])
        now = time.monotonic()
        for index, at in list(job.replace_at.items()):
            running = any(p.index == index and p.phase in ("Running", "Pending") for p in job.pods)
            if now >= at and not running:  # podReplacementPolicy Failed: once the old one is gone
                del job.replace_at[index]
                self._start_pod(job, index)
                self.calls.append(f"replace pod {index}")
        if not any(p.phase in ("Running", "Pending") for p in job.pods) and not job.replace_at:
            return V1JobStatus(failed=sum(job.failures.values()), conditions=[V1JobCondition(
                type="Failed", status="True", reason="BackoffLimitExceeded", message="every index failed")])
        return V1JobStatus(active=sum(p.phase in ("Running", "Pending") for p in job.pods),
                           failed=sum(job.failures.values()) or None)

    def _pod(self, pod_name: str) -> LocalPod:
        for job in self.jobs.values():
            for pod in job.pods:
                if pod.name == pod_name:
                    return pod
        raise _not_found("pods", pod_name)  # never created, or deleted with its Job

    def log_snapshot(self, pod_name: str, container: str, *, previous: bool, timestamps: bool) -> bytes:
        """The log so far, as a non-following read returns it; errors as the API server's."""
        pod = self._pod(pod_name)
        if container != CONTAINER:
            raise _bad_request(f"container {container} is not valid for pod {pod_name}")
        if previous:
            if pod.previous_log is None:
                raise _bad_request(f'previous terminated container "{container}" in pod "{pod_name}" not found')
            data = pod.previous_log
        else:
            if pod.proc is None:
                raise _bad_request(f'container "{container}" in pod "{pod_name}" is waiting to start')
            if pod.phase != "Running" and pod.pump:
                pod.pump.join(timeout=10)  # the exited container's last lines
            data = pod.log_path.read_bytes() if pod.log_path.exists() else b""
        if timestamps:
            return data
        return b"".join(line.partition(b" ")[2] for line in data.splitlines(keepends=True))

    def log_stream(self, pod_name: str) -> Iterator[bytes]:
        pod = next(p for j in self.jobs.values() for p in j.pods if p.name == pod_name)
        while not pod.log_path.exists():
            time.sleep(0.05)
        with pod.log_path.open("rb") as f:
            while True:
                chunk = f.readline()
                if chunk:
                    yield chunk
                    continue
                if pod.phase != "Running" and (pod.pump is None or not pod.pump.is_alive()):
                    rest = f.read()
                    if rest:
                        yield rest
                    return
                time.sleep(0.05)


def _pump(proc: subprocess.Popen, log_path: Path, after=None) -> threading.Thread:
    """The container's output into its log, each line timestamped; then ``after`` (image mode:
    the pod's root released), once the last process holding the output is gone."""

    def pump() -> None:
        try:
            with log_path.open("ab") as log:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(_now().encode() + b" " + line)
                    log.flush()
        finally:
            if after is not None:
                proc.wait()
                after()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def give_to_group(folder: Path, gid: int) -> None:
    """What a kubelet does to a volume for a pod's fsGroup (fsGroupChangePolicy Always): every file
    and folder belongs to the group and is group read-writable, folders setgid so new files stay in
    it. A file that goes while this runs (a pod writing beside) is skipped."""
    import stat

    for dirpath, dirnames, filenames in os.walk(folder):
        for name, is_dir in [(dirpath, True)] + [(os.path.join(dirpath, f), False) for f in filenames]:
            try:
                st = os.lstat(name)
                if stat.S_ISLNK(st.st_mode):
                    continue
                if st.st_gid != gid:
                    os.chown(name, -1, gid)
                mode = st.st_mode | stat.S_IRGRP | stat.S_IWGRP
                if is_dir:
                    mode |= stat.S_IXGRP | stat.S_ISGID
                elif st.st_mode & stat.S_IXUSR:
                    mode |= stat.S_IXGRP
                if mode != st.st_mode:
                    os.chmod(name, stat.S_IMODE(mode))
            except FileNotFoundError:
                continue


def _bad_request(message: str) -> ApiException:
    exc = ApiException(status=400, reason="Bad Request")
    exc.body = message
    return exc


class _LogResponse:
    """The raw HTTP response `read_namespaced_pod_log(..., _preload_content=False)` returns."""

    def __init__(self, data: bytes):
        self.data = data
        self.released = False

    def release_conn(self) -> None:
        self.released = True


def _not_found(kind: str, name: str) -> ApiException:
    exc = ApiException(status=404, reason="Not Found")
    exc.body = f'{kind} "{name}" not found'
    return exc


class _BatchApi:
    def __init__(self, cluster: LocalCluster):
        self.c = cluster

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> V1Job:
        assert body["metadata"]["namespace"] == namespace
        name = body["metadata"]["name"]
        if name in self.c.jobs:
            raise ApiException(status=409, reason="AlreadyExists")
        job = LocalJob(manifest=body, uid=str(uuid.uuid4()))
        self.c.jobs[name] = job
        self.c.calls.append(f"create Job {name}")
        self.c._start_pods(job)
        return V1Job(metadata=V1ObjectMeta(name=name, namespace=namespace, uid=job.uid))

    def read_namespaced_job_status(self, name: str, namespace: str) -> V1Job:
        job = self.c.jobs.get(name)
        if job is None:
            raise _not_found("jobs.batch", name)
        return V1Job(metadata=V1ObjectMeta(name=name, uid=job.uid), status=self.c._job_status(job))

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str | None = None) -> None:
        job = self.c.jobs.pop(name, None)
        if job is None:
            raise _not_found("jobs.batch", name)
        assert propagation_policy in ("Background", "Foreground"), "pods would be orphaned"
        self.c._kill(job)
        self.c.calls.append(f"delete Job {name}")
        for pod_name, (pod, body) in list(self.c.bare_pods.items()):
            if any(o["uid"] == job.uid for o in body["metadata"].get("ownerReferences", [])):
                self.c._end_pod(pod)
                del self.c.bare_pods[pod_name]
                self.c.calls.append(f"gc Pod {pod_name}")
        # Garbage collection of dependents (the Service owned through ownerReferences).
        for svc_name, svc in list(self.c.services.items()):
            if any(o["uid"] == job.uid for o in svc["metadata"].get("ownerReferences", [])):
                del self.c.services[svc_name]
                self.c.calls.append(f"gc Service {svc_name}")


class _CoreApi:
    def __init__(self, cluster: LocalCluster):
        self.c = cluster

    def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> None:
        self.c.services[body["metadata"]["name"]] = body
        self.c.calls.append(f"create Service {body['metadata']['name']}")

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        self.c._start_bare_pod(body)
        self.c.calls.append(f"create Pod {body['metadata']['name']}")

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.c.delete_pod(name)

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        if self.c.services.pop(name, None) is None:
            raise _not_found("services", name)
        self.c.calls.append(f"delete Service {name}")

    def list_namespaced_pod(self, namespace: str, label_selector: str = "", field_selector: str = "") -> V1PodList:
        key, _, value = label_selector.partition("=")
        pods = [p for j in self.c.jobs.values() for p in j.pods if not key or p.labels.get(key) == value]
        if field_selector.startswith("metadata.name="):
            pods = [p for p in pods if p.name == field_selector.split("=", 1)[1]]
        return V1PodList(items=[self.c._pod_object(p) for p in pods])

    def list_namespaced_event(self, namespace: str, field_selector: str = "") -> CoreV1EventList:
        name = field_selector.split("=", 1)[1]
        if self.c.schedulable:
            return CoreV1EventList(items=[])
        return CoreV1EventList(items=[CoreV1Event(
            metadata=V1ObjectMeta(name=f"{name}.1"), involved_object=V1ObjectReference(name=name),
            type="Warning", reason="FailedScheduling",
            message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            last_timestamp=datetime.now(timezone.utc))])

    def list_node(self) -> V1NodeList:
        return V1NodeList(items=self.c.nodes)

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Iterator[bytes] | _LogResponse:
        if kwargs.get("follow"):
            assert kwargs.get("timestamps"), kwargs
            return self.c.log_stream(name)
        # Preloaded content would be decoded (and a JSON-looking log parsed) by the real client.
        assert kwargs.get("_preload_content") is False, kwargs
        return _LogResponse(self.c.log_snapshot(
            name, kwargs.get("container") or CONTAINER, previous=bool(kwargs.get("previous")),
            timestamps=bool(kwargs.get("timestamps"))))
