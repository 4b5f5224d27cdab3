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
    # the shards on the volume too: pods run inside the image see nothing else of this host
    manifest, locations = make_dataset(shared / "data", n_train=96, n_test=32, per_shard=24)
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
        # Local stand-ins for what the image provides: the code on PYTHONPATH (left out when the
        # pods run inside the built image, POD_SIM_IMAGE), one thread each, gloo over loopback.
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


# --- user code in the image, the code-version check, the pod's own lineage -----------------------------
SHA = "1234567890abcdef1234567890abcdef12345678"
DIGEST = "sha256:" + "ab" * 32
USER_MODELS = '''"""A team's own model factory, outside the platform's packages."""
from torch import nn


def tiny(input_shape, num_classes, hidden=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
'''
USER_LOOP = '''"""A team's own training function, run on every rank with the TrainingContext."""
import torch
import torch.nn.functional as F


def train(ctx):
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=ctx.config.train.lr)
    step = 0
    if (state := ctx.restore_checkpoint()) is not None:
        ctx.load_state(model, opt, state["model"], state["optimizer"])
        step = state["step"]
    for _, batches in ctx.epochs(step):
        for batch in batches:
            loss = F.cross_entropy(model(batch["input"]), batch["target"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            ctx.report(step, loss=loss.item(), trained_by="acme_models.loops")
            if step % ctx.config.checkpoint.every_steps == 0 or step == ctx.total_steps:
                ctx.save_checkpoint(step, {"model": ctx.full_state(model),
                                           "optimizer": ctx.full_optimizer_state(model, opt)})
            if step == ctx.total_steps:
                break
    ctx.save_model(model)
'''


def _image_root(tmp_path: Path, *, git_sha: str) -> Path:
    """The training image's /opt/model-factory, assembled as helm/images/training.Dockerfile does:
    its COPY lines applied to a build context holding training_runtime/ and a team package
    (acme_models, passed as USER_CODE), then its build_info step run."""
    import re
    import shutil
    import subprocess
    import sys

    context = tmp_path / "build-context"
    shutil.copytree(REPO / "training_runtime", context / "training_runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    package = context / "acme_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(USER_MODELS)
    (package / "loops.py").write_text(USER_LOOP)
    image = tmp_path / "image"
    dockerfile = (REPO / "helm" / "images" / "training.Dockerfile").read_text()
    build_args = {"USER_CODE": "acme_models"}
    copies = re.findall(r"^COPY (\S+)/ \./(\S+)/$", dockerfile, flags=re.M)
    assert ("${USER_CODE}", "${USER_CODE}") in copies
    for src, dst in copies:
        src, dst = (re.sub(r"\$\{(\w+)\}", lambda m: build_args[m.group(1)], p) for p in (src, dst))
        shutil.copytree(context / src, image / dst)
    subprocess.run([sys.executable, "-m", "training_runtime.observe.build_info", "--git-sha", git_sha, "--dirty", "false",
                    "--user-code", "acme_models", "--out", str(image / "BUILD.json")], cwd=image, check=True,
                   timeout=60)
    return context, image


def _user_code_job(tmp_path: Path, monkeypatch, *, git_sha: str, nnodes: int):
    from core.spec import PipelineSpec, Recipe, Source
    from ops.training_config import runtime_config, training_job

    context, image = _image_root(tmp_path, git_sha=git_sha)
    # The code location has the team's package installed too: definitions check that it imports.
    monkeypatch.syspath_prepend(str(context))
    settings, sim = _setup(tmp_path, nnodes=nnodes)
    spec = PipelineSpec(name="acme_tiny", source=Source(paths=("x.csv",)), feature_columns=tuple("abcdefghijklmnop"),
                        label_column="y", class_names=("0", "1", "2", "3"), model="acme_models.nets:tiny",
                        model_kwargs={"hidden": 8}, train="acme_models.loops:train",
                        recipe=Recipe(epochs=1, batch_size=16, lr=0.05, world_size=nnodes, checkpoint_every_steps=3))
    work = Path(settings.shared_mount_path) / "acme_tiny" / "root-run-0001"
    config = runtime_config(spec, manifest=sim.config["data"]["manifest"], locations=sim.config["data"]["locations"],
                            commit_id="c0ffee", checkpoint_dir=work / "checkpoints", output_dir=work / "output")
    job = training_job(spec, "root-run-0001", config)
    # Each "pod" runs the image's files, not the repository's: acme_models exists only there.
    env = {**sim.env, "PYTHONPATH": str(image), "MODEL_FACTORY_BUILD_INFO": str(image / "BUILD.json")}
    return settings, TrainingJob(name=job.name, config=config, nproc_per_node=1, nnodes=nnodes, gpu=sim.gpu, env=env)


def _launch_versioned(cluster: LocalCluster, job: TrainingJob, settings: PodSettings, expected: dict):
    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.2, pending_timeout_s=60)

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        """Trains the team's code through the Kubernetes launcher against the local cluster."""
        run_training_job(context, client, job, settings, expected_code_version=expected)
        return dg.MaterializeResult()

    try:
        return dg.materialize([checkpoint], raise_on_error=False)
    finally:
        cluster.close()


@pytest.mark.slow
def test_a_pipeline_with_its_own_model_and_training_function_trains_from_the_image(tmp_path, monkeypatch):
    from core.lineage import pod_summary

    settings, job = _user_code_job(tmp_path, monkeypatch, git_sha=SHA, nnodes=2)
    (tmp_path / "cluster").mkdir()
    # Processes always: the image here is the one this test assembles (a team package, acme_models,
    # that the built training image does not hold), whatever POD_SIM_IMAGE says.
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=CPU_NODES, image=None,
                           image_id=f"docker-pullable://registry.example.com/model-factory/training@{DIGEST}")
    result = _launch_versioned(cluster, job, settings, {"git_sha": SHA, "dirty": False})
    logs = {p.name: p.read_text() for p in (tmp_path / "cluster").glob("*.log")}
    assert result.success, "\n".join(f"== {k}\n{v[-3000:]}" for k, v in logs.items())
    out = Path(job.config["output_dir"])
    card = json.loads((out / "model_card.json").read_text())
    assert "acme_models.nets:tiny" in json.dumps(card) and "acme_models.loops:train" in json.dumps(card)
    # The pod's own lineage: the image it ran (and the digest the launcher read from the pod
    # status), the commit baked in at build, where each rank ran, the pod's own torch.
    pod = json.loads((out / "resolved_config.json").read_text())["pod"]
    assert pod["image"] == settings.image and pod["image_digests"] == [DIGEST]
    assert pod["build"] == {"git_sha": SHA, "dirty": False, "user_code": "acme_models"}
    assert pod["nodes"] == ["cpu-a", "cpu-b"] and pod["torch"] == torch.__version__
    assert [r["rank"] for r in pod["ranks"]] == [0, 1]
    assert [r["pod"].rsplit("-", 1)[0] for r in pod["ranks"]] == [f"{job.name}-0", f"{job.name}-1"]
    summary = pod_summary(pod)
    assert f"{settings.image}@{DIGEST} built from git {SHA}" in summary and "nodes cpu-a, cpu-b" in summary


@pytest.mark.slow
def test_a_pod_whose_image_records_another_commit_fails_naming_both(tmp_path, monkeypatch):
    settings, job = _user_code_job(tmp_path, monkeypatch, git_sha=SHA, nnodes=1)
    (tmp_path / "cluster").mkdir()
    # Processes always: the image here is the one this test assembles (see above).
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=CPU_NODES, image=None)
    expected = "f" * 40
    result = _launch_versioned(cluster, job, settings, {"git_sha": expected, "dirty": False})
    assert not result.success
    text = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "CodeVersionMismatch" in text
    assert f"{settings.image} was built from git {SHA}" in text and f"expects git {expected}" in text
    assert not Path(job.config["checkpoint"]["dir"]).exists()  # stopped before any training
