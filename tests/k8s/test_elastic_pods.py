"""An elastic gang through the Kubernetes launcher, its pods run by the pod simulation
(tests/k8s/local_cluster.py): 3 pods of one gloo rank, ``--nnodes=2:3`` against the rendezvous
store pod. Pod 1 is deleted mid-training (SIGTERM: every rank checkpoints and stops); the gang
re-forms with 2 pods from that checkpoint, the Job controller replaces pod 1 once the cluster has
room again, and it joins: the training ends on 3. Rank 0's messages reach Dagster through the
shared volume (rank 0 may move pods), and a team's own training function records the samples each
rank trains on, which add up to whole epochs."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from resources.k8s.client import TrainingJobClient
from resources.k8s.launcher import run_training_job
from resources.k8s.manifests import PodSettings
from resources.k8s.step_config import s3_secret_env
from resources.launch.base import GpuRequest, TrainingJob
from tests.distributed.elastic_checks import check_whole_epochs, elastic_config, problem
from tests.k8s.helpers import node
from tests.k8s.local_cluster import LocalCluster
from tests.support.ports import free_ports

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SECRETS = {"model-factory-s3": {"AWS_ACCESS_KEY_ID": "AKIALOCALTEST", "AWS_SECRET_ACCESS_KEY": "local-secret"}}
N, PER_SHARD, BATCH, EPOCHS, EVERY = 144, 24, 24, 10, 4  # 6 steps an epoch, 60 in all; 24 splits over 2 and 3
STEP_S = 0.4


def test_a_deleted_pod_leaves_the_gang_which_goes_on_with_two_then_grows_back_to_three(tmp_path):
    shared = tmp_path / "shared"
    manifest, locations = problem(shared / "data", N, PER_SHARD)  # on the volume: image-mode pods see only it
    config = elastic_config(shared, manifest, locations, nodes=(2, 3), per_node=1, batch=BATCH, epochs=EPOCHS,
                            every=EVERY)
    (port,) = free_ports(1)
    settings = PodSettings(namespace="model-factory", image="registry.example.com/model-factory/training:local",
                           shared_mount_path=str(shared), rendezvous_port=port, rendezvous_join_timeout_s=120,
                           rendezvous_last_call_s=2,
                           secret_env=s3_secret_env("model-factory-s3"))
    job = TrainingJob(name="digits-elastic", config=config, nproc_per_node=1, nnodes=3, min_nodes=2, max_restarts=3,
                      gpu=GpuRequest(nodes=3, gpus_per_node=0, cpu="1", memory="2Gi"),
                      env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                           "TRAINING_RUNTIME_FAULT_SLOW_RANK": f"0:{STEP_S}"})
    (tmp_path / "cluster").mkdir()
    # The replacement finds room 25 s later, after the two that are left re-formed (2 s last call).
    cluster = LocalCluster(tmp_path / "cluster", secrets=SECRETS, nodes=[node(f"cpu-{c}", cpu="4") for c in "abc"],
                           replacement_delay_s=25, image_env={"PYTHONPATH": str(REPO)},
                           # inside the built image (POD_SIM_IMAGE), the team's training function
                           # (tests.runtime.sample_order_train) is added as its own build would add it
                           image_extras=((REPO / "tests", "/opt/model-factory/tests"),))
    client = TrainingJobClient(cluster.batch, cluster.core, poll_interval_s=0.2, pending_timeout_s=60)
    checkpoint_dir = Path(config["checkpoint"]["dir"])
    deleted: list[str] = []

    def delete_pod_1() -> None:
        deadline = time.monotonic() + 180
        while not (checkpoint_dir / f"step_{2 * EVERY:09d}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        pod = next(p for p in cluster.jobs[job.name].pods if p.index == 1)
        deleted.append(pod.name)
        cluster.delete_pod(pod.name)

    messages: list[dict] = []

    @dg.asset
    def checkpoint(context) -> dg.MaterializeResult:
        threading.Thread(target=delete_pod_1, daemon=True).start()
        messages.extend(run_training_job(context, client, job, settings).get_custom_messages())
        return dg.MaterializeResult()

    instance = dg.DagsterInstance.ephemeral()
    try:
        result = dg.materialize([checkpoint], raise_on_error=False, instance=instance)
    finally:
        cluster.close()
    logs = {p.name: p.read_text()[-3000:] for p in (tmp_path / "cluster").glob("*.log")}
    assert result.success, "\n".join(f"== {k}\n{v}" for k, v in logs.items())
    assert deleted and f"delete Pod {deleted[0]}" in cluster.calls and "replace pod 1" in cluster.calls
    store = "digits-elastic-rdzv"
    assert cluster.calls[:3] == ["create Job digits-elastic", "create Service digits-elastic", f"create Pod {store}"]
    assert not cluster.jobs and not cluster.bare_pods  # the store went with the Job

    metrics = json.loads((Path(config["output_dir"]) / "metrics.json").read_text())
    assert [a["world_size"] for a in metrics["attempts"]] == [3, 2, 3], metrics["attempts"]
    assert [(r["from_world_size"], r["to_world_size"]) for r in metrics["resizes"]] == [(3, 2), (2, 3)]
    assert metrics["steps"] == EPOCHS * N // BATCH
    # the guards judge each group alone: a resize is no hang
    assert not [d for d in metrics["detections"] if d["detector"] == "hang"], metrics["detections"]
    # Every attempt's rank 0 reported to Dagster through the shared volume: the final figures at 3.
    (final,) = [m for m in messages if m.get("kind") == "final"]
    assert final["world_size"] == 3
    logged = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("the gang resized from 3 to 2 ranks" in m for m in logged)
    assert any("the gang resized from 2 to 3 ranks" in m for m in logged)
    kept = check_whole_epochs(config, manifest, metrics, batch=BATCH)
    assert {r["world"] for r in kept} == {2, 3}
