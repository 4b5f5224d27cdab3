"""FSDP's workers start with a fixed mmap threshold from the platform's launchers (local torchrun
and the pod), so the buffers FSDP frees leave RSS; DDP's do not; the user's setting wins."""

from __future__ import annotations

from resources.k8s.manifests import PodSettings, build_pod_template
from resources.launch.base import TrainingJob
from resources.launch.local import worker_env
from training_runtime.distributed.allocator import allocator_env


def _job(sharding: str, env: dict | None = None) -> TrainingJob:
    return TrainingJob(name="t", config={"train": {"sharding": sharding}, "checkpoint": {"dir": "/w/ckpt"}},
                       nproc_per_node=2, env=dict(env or {}))


def test_fsdp_and_hsdp_get_the_threshold_and_ddp_does_not():
    assert allocator_env({"train": {"sharding": "fsdp"}}) == {"MALLOC_MMAP_THRESHOLD_": "1048576"}
    assert allocator_env({"train": {"sharding": "hsdp"}}) == {"MALLOC_MMAP_THRESHOLD_": "1048576"}
    assert allocator_env({"train": {"sharding": "ddp"}}) == {}
    assert allocator_env({"train": {}}) == {}


def test_the_local_launchers_workers_get_it_unless_the_user_set_their_own():
    assert worker_env(_job("fsdp"), [], environ={}, cpu_count=2)["MALLOC_MMAP_THRESHOLD_"] == "1048576"
    assert "MALLOC_MMAP_THRESHOLD_" not in worker_env(_job("ddp"), [], environ={}, cpu_count=2)
    # The launching process's own value reaches the workers (Pipes passes os.environ on): not overridden.
    mine = worker_env(_job("fsdp"), [], environ={"MALLOC_MMAP_THRESHOLD_": "65536"}, cpu_count=2)
    assert "MALLOC_MMAP_THRESHOLD_" not in mine
    assert worker_env(_job("fsdp", {"MALLOC_MMAP_THRESHOLD_": "4096"}), [], environ={},
                      cpu_count=2)["MALLOC_MMAP_THRESHOLD_"] == "4096"


def _pod_env(job: TrainingJob) -> dict:
    pod = build_pod_template(job, PodSettings(namespace="n", image="registry.example/model-factory:1"), {})
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_pods_get_it_and_the_jobs_own_env_overrides_it():
    assert _pod_env(_job("fsdp"))["MALLOC_MMAP_THRESHOLD_"] == "1048576"
    assert "MALLOC_MMAP_THRESHOLD_" not in _pod_env(_job("ddp"))
    assert _pod_env(_job("fsdp", {"MALLOC_MMAP_THRESHOLD_": "4096"}))["MALLOC_MMAP_THRESHOLD_"] == "4096"
