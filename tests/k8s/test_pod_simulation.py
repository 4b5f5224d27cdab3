"""Pod simulation: the generated multi-node Indexed Job, run pod by pod as local processes.

The launcher (`run_training_job`) builds the Job and Service, "submits" them to a LocalCluster
that starts each pod's own command and env as a process (completion index per pod, the pods'
DNS names mapped to loopback addresses), reads rank 0's Pipes messages from pod 0's log with
dagster-k8s's PipesK8sPodLogsMessageReader, waits for the Job, and deletes Job and Service.
`python -m training_runtime` trains for real over 2 pods x 1 process with gloo: the manifest's
torchrun wiring (c10d rendezvous on pod 0's name, node ranks, env, secrets) is proven, not assumed.
The same job through the local launcher trains the same weights, so the launchers cannot drift.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
import torch
from safetensors.torch import load_file

from resources.k8s.client import TrainingJobClient
from resources.k8s.feasibility import InfeasibleGpuRequest, PodStuckPending
from resources.k8s.launcher import pod_log_root, run_training_job
from resources.k8s.manifests import PodSettings
from resources.k8s.step_config import s3_secret_env
from resources.launch.base import GpuRequest, TrainingJob
from resources.launch.local import LocalTorchrunLauncher
from tests.k8s.local_cluster import LocalCluster, expand
from tests.k8s.helpers import h100, node
from tests.runtime.helpers import make_config, make_dataset
from tests.support.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
SECRETS = {"model-factory-s3": {"AWS_ACCESS_KEY_ID": "AKIALOCALTEST", "AWS_SECRET_ACCESS_KEY": "local-secret"}}
CPU_NODES = [node("cpu-a", cpu="4", memory="16Gi"), node("cpu-b", cpu="4", memory="16Gi")]


def _setup(tmp_path: Path, *, nnodes: int = 2, epochs: int = 1, **gpu):
    shared = tmp_path / "shared"  # the PVC: same path in the "step" (this test) and the pods
    manifest, locations = make_dataset(tmp_path / "data", n_train=96, n_test=32, per_shard=24)
    config = make_config(shared, manifest, locations, name="digits", epochs=epochs)
    (port,) = free_ports(1)
    settings = PodSettings(
        namespace="model-factory",
        image="registry.example.com/model-factory/training:local",
        shared_mount_path=str(shared),
        rendezvous_port=port,
        rendezvous_join_timeout_s=60,
        secret_env=s3_secret_env("model-factory-s3"),
    )
    job = TrainingJob(
        name="digits-sim",
        config=config,
        nproc_per_node=1,
        nnodes=nnodes,
        gpu=GpuRequest(nodes=nnodes, gpus_per_node=0, cpu="1", memory="2Gi", **gpu),
        # Local stand-ins for what the image provides: the code on PYTHONPATH, one thread each,
        # gloo over loopback.
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
    )
    return settings, job


def _launch(cluster: LocalCluster, job: TrainingJob, settings: PodSettings, *, pending_timeout_s: float = 60):
    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.2, pending_timeout_s=pending_timeout_s)
    outcome: dict = {}

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        """Trains through the Kubernetes launcher against the local cluster."""
        invocation = run_training_job(context, client, job, settings)
        outcome["messages"] = invocation.get_custom_messages()
        return dg.MaterializeResult()

    try:
        result = dg.materialize([checkpoint], raise_on_error=False)
    finally:
        cluster.close()
    return result, outcome


@pytest.mark.slow
def test_two_pod_indexed_job_trains_with_gloo_and_reports_through_pipes(tmp_path):
    settings, job = _setup(tmp_path)
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=CPU_NODES)
    (tmp_path / "cluster").mkdir()
    result, outcome = _launch(cluster, job, settings)
    logs = {p.name: p.read_text() for p in (tmp_path / "cluster").glob("*.log")}
    assert result.success, "\n".join(f"== {k}\n{v[-3000:]}" for k, v in logs.items())

    # Rank 0 (in pod 0) reported through Pipes; the launcher got its final figures.
    finals = [m for m in outcome["messages"] if m.get("kind") == "final"]
    assert len(finals) == 1 and finals[0]["world_size"] == 2
    # Each telemetry message also became an observation of the asset as it came (live_telemetry.py).
    telemetry = [m["step"] for m in outcome["messages"] if m.get("kind") == "telemetry"]
    observed = [e.asset_observation_data.asset_observation.metadata["step"].value
                for e in result.get_asset_observation_events()]
    assert telemetry and observed == telemetry
    # Outputs landed on the shared volume where the step reads them.
    out = Path(job.config["output_dir"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    state = load_file(out / "model.safetensors")
    assert state
    # The config the pods ran is the one the launcher wrote to the shared volume.
    launched = json.loads(Path(settings.shared_mount_path, "launches", job.name, "config.json").read_text())
    assert launched["output_dir"] == job.config["output_dir"]
    # Job and Service were created, then deleted by the launcher (the Service explicitly).
    assert cluster.calls == ["create Job digits-sim", "create Service digits-sim",
                             "delete Service digits-sim", "delete Job digits-sim"]
    assert not cluster.jobs and not cluster.services
    pod0_log, pod1_log = (logs[f"digits-sim-{i}.log"] for i in (0, 1))
    # Only pod 0 carries Pipes messages; pod 1 trains silently.
    assert "__dagster_pipes_version" in pod0_log
    assert "__dagster_pipes_version" not in pod1_log
    # Both pods' logs were kept on the shared volume before the Job was deleted, pod 1's too.
    kept = {p.parent.name.rsplit("-", 1)[0]: p.read_text()
            for p in (pod_log_root(job, settings) / "launch_0").glob("*/trainer.log")}
    assert sorted(kept) == ["digits-sim-0", "digits-sim-1"]
    assert "__dagster_pipes_version" in kept["digits-sim-0"] and "[rank1]" not in kept["digits-sim-0"]
    assert kept["digits-sim-1"] == pod1_log

    # The launchers cannot drift apart: the same job through the local launcher (one node,
    # two processes under PipesSubprocessClient) reports alike and trains the same model.
    local_root = tmp_path / "local"
    local_config = make_config(local_root, job.config["data"]["manifest"], job.config["data"]["locations"],
                               name="digits", epochs=1)
    local_job = TrainingJob(name=job.name, config=local_config, nproc_per_node=2, env=job.env)
    local_messages: list[dict] = []

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        """Trains through the local launcher."""
        invocation = LocalTorchrunLauncher(local_root / "launches").launch(context, local_job)
        local_messages.extend(invocation.get_custom_messages())
        return dg.MaterializeResult()

    assert dg.materialize([checkpoint]).success
    (local_final,) = [m for m in local_messages if m.get("kind") == "final"]
    assert local_final.keys() == finals[0].keys()
    local_state = load_file(Path(local_config["output_dir"]) / "model.safetensors")
    torch.testing.assert_close(state, local_state)


@pytest.mark.slow
def test_a_failing_pod_fails_the_launch_and_cleans_up(tmp_path):
    # One pod is enough to prove the failure path (two-pod wiring is proven above).
    settings, job = _setup(tmp_path, nnodes=1)
    job.config["train"]["optimizer"] = "no-such-optimizer"
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=CPU_NODES)
    (tmp_path / "cluster").mkdir()
    result, _ = _launch(cluster, job, settings)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    text = error.to_string()
    # The pod's own exit and the runtime's message reach the step's error.
    assert "TrainingJobFailed: training Job digits-sim failed" in text
    assert "Job BackoffLimitExceeded" in text and "container trainer exited 1" in text
    assert "train.optimizer" in text
    assert cluster.calls == ["create Job digits-sim", "delete Job digits-sim"]
    assert not cluster.jobs
    # The failed pod's whole log was kept before the deletion, the runtime's error in it.
    (kept,) = (pod_log_root(job, settings) / "launch_0").glob("digits-sim-0-*/trainer.log")
    assert "train.optimizer" in kept.read_text()


def test_infeasible_request_fails_before_anything_is_created(tmp_path):
    settings, job = _setup(tmp_path)
    job = TrainingJob(name=job.name, config=job.config, nproc_per_node=8, nnodes=2,
                      gpu=GpuRequest(nodes=2, gpus_per_node=8, tolerations=(
                          {"key": "nvidia.com/gpu", "operator": "Exists"},)))
    cluster = LocalCluster(tmp_path, nodes=[h100("gpu-a"), h100("gpu-c", gpus="4")])
    result, _ = _launch(cluster, job, settings)
    assert not result.success
    text = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert InfeasibleGpuRequest.__name__ in text and "gpu-c: allocatable nvidia.com/gpu=4 < 8" in text
    assert cluster.calls == []


def test_pod_pending_past_the_timeout_fails_with_the_schedulers_reason(tmp_path):
    settings, job = _setup(tmp_path)
    cluster = LocalCluster(tmp_path, nodes=CPU_NODES, schedulable=False)
    result, _ = _launch(cluster, job, settings, pending_timeout_s=0.5)
    assert not result.success
    text = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert PodStuckPending.__name__ in text
    assert "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in text
    assert "event FailedScheduling" in text
    assert not pod_log_root(job, settings).exists()  # no container started: no logs to keep
    # Nothing leaks: the Job is deleted and the Service is deleted explicitly.
    assert cluster.calls == ["create Job digits-sim", "create Service digits-sim",
                             "delete Service digits-sim", "delete Job digits-sim"]


def test_missing_secret_key_fails_at_once(tmp_path):
    settings, job = _setup(tmp_path, nnodes=1)
    cluster = LocalCluster(tmp_path, secrets={}, nodes=CPU_NODES)
    result, _ = _launch(cluster, job, settings, pending_timeout_s=300)
    assert not result.success
    text = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "CreateContainerConfigError" in text and "AWS_ACCESS_KEY_ID" in text
    assert cluster.calls == ["create Job digits-sim", "delete Job digits-sim"]


def test_kubelet_expansion_matches_kubernetes():
    env = {"POD_INDEX": "1"}
    assert expand("--local-addr=x-$(POD_INDEX).svc", env) == "--local-addr=x-1.svc"
    assert expand("$$(POD_INDEX) $(UNSET)", env) == "$(POD_INDEX) $(UNSET)"


@pytest.mark.slow
def test_cancelling_the_step_deletes_job_and_service_and_stops_pods(tmp_path):
    """Dagster cancels a run by raising inside the step; the launcher's `finally` must run."""
    from resources.k8s.manifests import build_manifests

    settings, job = _setup(tmp_path, epochs=50)
    (tmp_path / "cluster").mkdir()
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=CPU_NODES)
    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.2, pending_timeout_s=60)
    Path(settings.shared_mount_path, "launches", job.name).mkdir(parents=True)
    Path(settings.shared_mount_path, "launches", job.name, "config.json").write_text(json.dumps(job.config))
    try:
        with pytest.raises(KeyboardInterrupt):
            with client.launched(build_manifests(job, settings)) as name:
                pods = client.wait_started(name, settings.namespace, job.nnodes)
                assert [p.status.phase for p in pods] == ["Running", "Running"]
                processes = [p.proc for j in cluster.jobs.values() for p in j.pods]
                raise KeyboardInterrupt  # what the step sees when the run is terminated
    finally:
        cluster.close()
    assert cluster.calls == ["create Job digits-sim", "create Service digits-sim",
                             "delete Service digits-sim", "delete Job digits-sim"]
    assert all(proc.poll() is not None for proc in processes)
