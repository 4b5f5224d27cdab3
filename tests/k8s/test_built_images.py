"""The training image, built here from its Dockerfile (``make images``, helm/images/local_build.py),
run as its pod would run it: the manifest's own command (torchrun and ``-m training_runtime``) and
environment over the image's, as the pod's user (runAsUser 1000), with the shared volume mounted
where the pod mounts it (tests/k8s/image_root.py). A 2-rank CPU training on small shards trains,
the runtime checks the image's BUILD.json against the code version it is handed, and the image
has no Dagster. Heavy: building takes minutes the first time (the image is cached by its inputs
after), and it needs root, buildah and debootstrap."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from core.code_version import code_version
from resources.k8s.client import TrainingJobClient
from resources.k8s.launcher import KubernetesTrainingLauncher
from resources.k8s.manifests import PodSettings, build_manifests, build_training_job, config_json, config_path
from resources.launch.base import GpuRequest, TrainingJob
from tests.k8s.image_root import image_inspect, image_root, tools_missing
from tests.k8s.local_cluster import LocalCluster, process_tree
from tests.k8s.helpers import node
from tests.runtime.helpers import make_config, make_dataset
from tests.support.ports import free_ports
from training_runtime.observe.build_info import EXPECTED_CODE_VERSION_ENV

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
SHARED = "/mnt/training"  # the PVC's mount path in the pod


def _built(name: str, tmp_path_factory) -> dict:
    """``make images``' build of one image (cached by its inputs): its record, SBOM path included."""
    missing = tools_missing() or (None if os.geteuid() == 0 else "running images here needs root")
    if missing:
        pytest.skip(missing)
    out = tmp_path_factory.mktemp("images") / "built.json"
    proc = subprocess.run([sys.executable, "helm/images/local_build.py", name, "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())[name]


@pytest.fixture(scope="module")
def training_built(tmp_path_factory) -> dict:
    return _built("training", tmp_path_factory)


@pytest.fixture(scope="module")
def training_image(training_built) -> str:
    sbom = json.loads(Path(training_built["sbom"]).read_text())  # copied out beside the image
    names = {d["metadata"]["name"].lower(): d["metadata"]["version"] for d in sbom["installed"]}
    assert names["torch"].startswith("2.13.0") and "dagster-pipes" in names and "dagster" not in names
    return training_built["image"]


def _holds_exactly_its_lock(built: dict, committed: str, own: set[str] = frozenset()) -> None:
    """The SBOM (pip inspect, written in the image) against the lock the image was installed from
    (copied into it beside the SBOM): nothing in the image that the lock does not pin, at its pin,
    but the image's ``own`` package; and that lock is the committed one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_lock", REPO / "helm/images/lock.py")
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    sbom = json.loads(Path(built["sbom"]).read_text())
    in_image = Path(built["lock"]).read_text()
    assert in_image == (REPO / committed).read_text()
    cuda = ""
    if "cuda_lock" in built:  # the training image's CUDA additions (nothing a CPU build installs)
        cuda = Path(built["cuda_lock"]).read_text()
        assert cuda == (REPO / "helm/images/training.cuda.lock.txt").read_text()
    import tomllib

    ours = {"model-factory": tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]}
    third_party = {**sbom, "installed": [d for d in sbom["installed"]
                                         if lock.canonicalize_name(d["metadata"]["name"]) not in own]}
    assert lock.unlocked(third_party, in_image + cuda) == []
    # every pin is installed too: the lock is what the image holds, not a superset of it
    installed = lock.installed(sbom)
    assert sorted(set(lock.parse_lock(in_image)) - set(installed)) == []
    assert {n: installed[n]["version"] for n in own} == {n: ours[n] for n in own}


def test_the_training_image_holds_exactly_what_its_lock_pins(training_built):
    assert "cuda_lock" in training_built
    _holds_exactly_its_lock(training_built, "helm/images/training.lock.txt")


def test_the_code_location_image_holds_exactly_what_its_lock_pins(code_location_built):
    """Its own package (pip install --no-deps .) is the one distribution beyond the lock."""
    _holds_exactly_its_lock(code_location_built, "helm/images/code-location.lock.txt", own={"model-factory"})


def _pod(tmp_path: Path, image: str) -> tuple[TrainingJob, PodSettings, dict, Path]:
    """A one-pod, two-rank CPU training whose files lie in ``tmp_path/shared``, seen at SHARED."""
    shared = tmp_path / "shared"
    manifest, locations = make_dataset(shared / "data", n_train=96, n_test=32, per_shard=24)
    locations = {k: v.replace(shared.as_uri(), "file://" + SHARED) for k, v in locations.items()}
    config = make_config(Path(SHARED), manifest, locations, name="smoke", epochs=1)
    settings = PodSettings(namespace="model-factory", image=image, shared_mount_path=SHARED)
    job = TrainingJob(name="smoke-image", config=config, nproc_per_node=2,
                      gpu=GpuRequest(nodes=1, gpus_per_node=0, cpu="1", memory="2Gi"))
    path = shared / Path(config_path(job, settings)).relative_to(SHARED)
    path.parent.mkdir(parents=True)
    path.write_text(config_json(job.config))
    subprocess.run(["chown", "-R", "1000:1000", str(shared)], check=True)  # the PVC's fsGroup does this
    expected = {EXPECTED_CODE_VERSION_ENV: json.dumps(code_version(), sort_keys=True)}
    return job, settings, build_training_job(job, settings, expected), shared


def test_the_training_image_trains_two_ranks_as_its_pod_would(tmp_path, training_image):
    job, settings, manifest, shared = _pod(tmp_path, training_image)
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env, missing = LocalCluster(tmp_path)._container_env(container, 0, "smoke-image-0-abcde", "node-a")
    assert not missing
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    with image_root(training_image) as root:
        root.bind(shared, SHARED)
        proc = root.run(container["command"], env={**env, "OMP_NUM_THREADS": "1"}, user=user)
        whoami = root.run(["id", "-u"], env=env, user=user).stdout.strip()
        build = json.loads((root.mnt / "opt/model-factory/BUILD.json").read_text())
        no_dagster = root.run(["python", "-c", "import dagster"], env=env, user=user)
        pipes = root.run(["python", "-c", "import dagster_pipes, training_runtime; print('ok')"], env=env, user=user)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert container["command"][:2] == ["torchrun", "--nproc-per-node=2"]
    out = shared / Path(job.config["output_dir"]).relative_to(SHARED)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] > 0 and (out / "model.safetensors").is_file()
    assert whoami == "1000" and (out / "model.safetensors").stat().st_uid == 1000  # the pod's user, not root
    # the image records the commit it was built from, and the runtime checked it against the run's
    assert build["git_sha"] == code_version()["git_sha"] and "differs from" not in proc.stderr
    assert no_dagster.returncode != 0 and "No module named 'dagster'" in no_dagster.stderr
    assert pipes.stdout.strip() == "ok", pipes.stderr


@pytest.fixture(scope="module")
def code_location_built(tmp_path_factory) -> dict:
    return _built("code-location", tmp_path_factory)


@pytest.fixture(scope="module")
def code_location_image(code_location_built) -> str:
    return code_location_built["image"]


def _wait_for_ping(client, server: subprocess.Popen, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.ping("hello")
        except Exception as exc:  # the server is still loading the definitions, or it died
            if server.poll() is not None:
                raise AssertionError(f"the code server exited {server.returncode}: {server.stdout.read()[-4000:]}") from exc
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer to the ping in {timeout_s:g} s") from exc
            time.sleep(1)


def test_the_code_location_image_serves_its_definitions_over_grpc_as_its_user(tmp_path, code_location_image):
    """The image's own command (``dagster api grpc -m pipelines.definitions``), on a free port in
    place of 3030, as the image's user: the code server loads the definitions and answers the ping
    that the webserver and the daemon send, and lists its repository."""
    from dagster._grpc.client import DagsterGrpcClient
    from dagster._serdes import deserialize_value

    from tests.support.ports import free_ports

    (port,) = free_ports(1)
    with image_root(code_location_image) as root:
        command = list(root.config["Cmd"])
        command[command.index("-p") + 1] = str(port)
        assert command[:5] == ["dagster", "api", "grpc", "-m", "pipelines.definitions"]
        assert root.config["User"] == "1000:1000"
        server = root.start(command, env={})
        try:
            client = DagsterGrpcClient(port=port, host="127.0.0.1")
            echoed = _wait_for_ping(client, server)
            repositories = client.list_repositories()
            whoami = root.run(["id", "-u"], env={}).stdout.strip()
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    assert echoed["echo"] == "hello"
    listed = deserialize_value(repositories)  # a ListRepositoriesResponse, as the webserver reads it
    assert [r.repository_name for r in listed.repository_symbols], listed
    assert whoami == "1000"


# --- the pod simulation inside the image (tests/k8s/local_cluster.py's image mode) -----------------
def _pod_processes(cluster: LocalCluster) -> dict[str, list[dict]]:
    """Every process of every running pod now: its root, command line and user, from /proc."""
    seen: dict[str, list[dict]] = {}
    for pod in [p for j in list(cluster.jobs.values()) for p in j.pods]:
        if pod.proc is None or pod.root is None or pod.proc.poll() is not None:
            continue
        for pid in process_tree(pod.proc.pid):
            try:
                root = os.readlink(f"/proc/{pid}/root")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                uid = next(l.split()[1] for l in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if l.startswith("Uid:"))
            except (OSError, StopIteration):
                continue  # gone meanwhile
            seen.setdefault(pod.name, []).append({"root": root, "expected_root": str(pod.root.mnt),
                                                  "argv": [a.decode() for a in cmdline if a], "uid": uid})
    return seen


def _image_file(image: str, path: str) -> str:
    with image_root(image) as root:
        return (root.mnt / path.lstrip("/")).read_text()


def _podsim_containers() -> set[str]:
    out = subprocess.run(["buildah", "containers", "--format", "{{.ContainerName}}"], capture_output=True,
                         text=True, check=True).stdout.split()
    return {c for c in out if c.startswith("podsim-")}


def test_a_training_launched_through_the_kubernetes_launcher_runs_inside_the_image(tmp_path, training_image,
                                                                                    monkeypatch):
    """KubernetesTrainingLauncher.launch, unchanged, against a LocalCluster in image mode: two pods
    of one gloo rank each, rendezvous between them. Every process of both pods runs in its own
    root of the image as uid 1000, the workers are the image's /opt/venv python (not this
    checkout's .venv), the pods read the image's BUILD.json (the job sets no stand-in for it) and
    the code-version check passes against it; the lineage carries the image's digest as the pods'
    status reported it; every pod's root is gone afterwards."""
    shared = tmp_path / "shared"
    manifest, locations = make_dataset(shared / "data", n_train=96, n_test=32, per_shard=24)
    config = make_config(shared, manifest, locations, name="digits", epochs=2)
    before = _podsim_containers()
    (tmp_path / "cluster").mkdir()
    cluster = LocalCluster(tmp_path / "cluster", image=training_image, nodes=[node("cpu-a", cpu="4"),
                                                                               node("cpu-b", cpu="4")])
    assert cluster.image == training_image, cluster.image_note
    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.2, pending_timeout_s=120)
    (port,) = free_ports(1)
    settings_of = KubernetesTrainingLauncher.pod_settings
    monkeypatch.setattr(KubernetesTrainingLauncher, "_client", lambda self: client)  # the API server here
    monkeypatch.setattr(KubernetesTrainingLauncher, "pod_settings",
                        lambda self: dataclasses.replace(settings_of(self), rendezvous_port=port))
    launcher = KubernetesTrainingLauncher(namespace="model-factory", image=training_image,
                                          shared_mount_path=str(shared), s3_secret=None, lakefs_secret=None,
                                          load_incluster_config=False, poll_interval_s=0.2)
    job = TrainingJob(name="digits-in-image", config=config, nproc_per_node=1, nnodes=2,
                      gpu=GpuRequest(nodes=2, gpus_per_node=0, cpu="1", memory="2Gi"),
                      env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}, code_version=code_version())
    samples: list[dict[str, list[dict]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.3):
            samples.append(_pod_processes(cluster))

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        """Trains through the Kubernetes launcher against the pod simulation in image mode."""
        launcher.launch(context, job)
        return dg.MaterializeResult()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = dg.materialize([checkpoint], raise_on_error=False)
    finally:
        done.set()
        sampler.join()
        cluster.close()
    logs = {p.name: p.read_text()[-3000:] for p in (tmp_path / "cluster").glob("*.log")}
    assert result.success, "\n".join(f"== {k}\n{v}" for k, v in logs.items())

    procs = {pod: [p for s in samples for p in s.get(pod, [])] for pod in {k for s in samples for k in s}}
    assert len(procs) == 2, procs  # both pods seen running
    for pod, seen in procs.items():
        assert all(p["root"] == p["expected_root"] for p in seen), (pod, seen)  # chrooted, each in its own root
        assert all(p["uid"] == "1000" for p in seen), (pod, seen)
        workers = [p["argv"] for p in seen if "-m" in p["argv"][:3]]  # torchrun's workers: python -u -m ...
        assert workers and all(w[0] in ("/opt/venv/bin/python", "/opt/venv/bin/python3") for w in workers), (pod, workers)
    assert not any(str(REPO) in a for s in samples for ps in s.values() for p in ps for a in p["argv"])

    pod = json.loads((Path(config["output_dir"]) / "resolved_config.json").read_text())["pod"]
    image_build = json.loads(_image_file(training_image, "/opt/model-factory/BUILD.json"))
    assert pod["build"] == image_build and pod["build"]["git_sha"] == code_version()["git_sha"]
    assert pod["image"] == training_image
    assert pod["image_digests"] == [image_inspect(training_image)["FromImageDigest"]]
    assert pod["nodes"] == ["cpu-a", "cpu-b"]
    assert _podsim_containers() == before  # every pod's working container removed
    assert not [l for l in Path("/proc/mounts").read_text().splitlines() if "podsim-" in l]


def test_deleting_a_pod_that_runs_inside_the_image_ends_its_whole_process_tree(tmp_path, training_image):
    """A pod deleted while it trains in image mode: SIGTERM to every process of it (torchrun and
    its workers, in sessions of their own), SIGKILL to what is left after the grace period, as a
    kubelet ends a pod's containers; then its root is unmounted and removed."""
    shared = tmp_path / "shared"
    manifest, locations = make_dataset(shared / "data", n_train=96, n_test=32, per_shard=24)
    config = make_config(shared, manifest, locations, name="long", epochs=500)
    settings = PodSettings(namespace="model-factory", image=training_image, shared_mount_path=str(shared))
    job = TrainingJob(name="long-in-image", config=config, nproc_per_node=2,
                      gpu=GpuRequest(nodes=1, gpus_per_node=0, cpu="1", memory="2Gi"),
                      env={"OMP_NUM_THREADS": "1"})
    path = Path(config_path(job, settings))
    path.parent.mkdir(parents=True)
    path.write_text(config_json(job.config))
    (tmp_path / "cluster").mkdir()
    cluster = LocalCluster(tmp_path / "cluster", image=training_image, grace_s=5)
    try:
        job_manifest = next(m for m in build_manifests(job, settings) if m["kind"] == "Job")
        cluster.batch.create_namespaced_job("model-factory", job_manifest)
        (pod,) = cluster.jobs[job.name].pods
        deadline = time.monotonic() + 120
        while len(tree := process_tree(pod.proc.pid)) < 3:  # torchrun and both workers
            assert pod.proc.poll() is None and time.monotonic() < deadline, pod.log_path.read_text()[-3000:]
            time.sleep(0.2)
        assert all(os.readlink(f"/proc/{p}/root") == str(pod.root.mnt) for p in tree)
        container = pod.root.container
        cluster.delete_pod(pod.name)
        alive = [p for p in tree if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)]
        assert not alive, alive
        pod.pump.join(timeout=30)
        assert container not in _podsim_containers() and pod.root.container == ""
    finally:
        cluster.close()


def _state(pid: int) -> str:
    try:
        return next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("State:"))
    except (OSError, StopIteration):
        return "zombie"  # gone
