"""The training image, built here from its Dockerfile (``make images``, helm/images/local_build.py),
run as its pod would run it: the manifest's own command (torchrun and ``-m training_runtime``) and
environment over the image's, as the pod's user (runAsUser 1000), with the shared volume mounted
where the pod mounts it (tests/k8s/image_root.py). A 2-rank CPU training on small shards trains,
the runtime checks the image's BUILD.json against the code version it is handed, and the image
has no Dagster. Heavy: building takes minutes the first time (the image is cached by its inputs
after), and it needs root, buildah and debootstrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.code_version import code_version
from resources.k8s.manifests import PodSettings, build_training_job, config_json, config_path
from resources.launch.base import GpuRequest, TrainingJob
from tests.k8s.image_root import image_root, tools_missing
from tests.k8s.local_cluster import LocalCluster
from tests.runtime.helpers import make_config, make_dataset
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
def training_image(tmp_path_factory) -> str:
    built = _built("training", tmp_path_factory)
    sbom = json.loads(Path(built["sbom"]).read_text())  # copied out beside the image
    names = {d["metadata"]["name"].lower(): d["metadata"]["version"] for d in sbom["installed"]}
    assert names["torch"].startswith("2.13.0") and "dagster-pipes" in names and "dagster" not in names
    return built["image"]


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
def code_location_image(tmp_path_factory) -> str:
    return _built("code-location", tmp_path_factory)["image"]


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
