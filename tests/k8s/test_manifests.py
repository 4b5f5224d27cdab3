"""Pure manifest builders: the shapes of single-node, multi-node, MIG, tolerations, priority,
shm, secrets and NCCL settings, each validated against the Kubernetes 1.31 schemas."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest

from resources.k8s.manifests import (
    INDEX_ANNOTATION,
    JOB_LABEL,
    MAX_JOB_NAME,
    POD_INDEX_ENV,
    build_headless_service,
    build_manifests,
    build_training_job,
    check_paths_on_shared_volume,
    config_path,
    pod_fqdn,
    torchrun_args,
)
from tests.k8s.helpers import K8S_VERSION, make_job, validate_all

PIPES_ENV = {"DAGSTER_PIPES_CONTEXT": "eyJ4IjoxfQ==", "DAGSTER_PIPES_MESSAGES": "eyJ5IjoyfQ=="}


def _pod(manifest):
    return manifest["spec"]["template"]["spec"]


def _container(manifest):
    (container,) = _pod(manifest)["containers"]
    return container


def _env(manifest):
    return {e["name"]: e for e in _container(manifest)["env"]}


def test_single_node_job_runs_torchrun_standalone_with_n_gpus(settings):
    job = make_job(nproc=4)
    manifests = build_manifests(job, settings, PIPES_ENV)
    assert [m["kind"] for m in manifests] == ["Job"]  # no Service for one pod
    (m,) = manifests
    assert validate_all(manifests) == 1
    spec = m["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 1, 1)
    cmd = _container(m)["command"]
    assert cmd[:4] == ["torchrun", "--nproc-per-node=4", "--standalone", "--nnodes=1"]
    assert not any(a.startswith("--rdzv") for a in cmd)
    assert cmd[-4:] == ["-m", "training_runtime", "--config", config_path(job, settings)]
    res = _container(m)["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "4"
    assert "subdomain" not in _pod(m)


def test_multi_node_indexed_job_and_headless_service(settings):
    job = make_job(nnodes=3, nproc=8)
    job_m, svc = build_manifests(job, settings, PIPES_ENV)
    assert validate_all([job_m, svc]) == 2
    assert (job_m["spec"]["completions"], job_m["spec"]["parallelism"]) == (3, 3)
    assert _pod(job_m)["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    # The Service selects exactly the pods of this Job, by the label the template sets.
    assert svc["spec"]["selector"] == {JOB_LABEL: job.name}
    assert job_m["spec"]["template"]["metadata"]["labels"][JOB_LABEL] == job.name
    cmd = _container(job_m)["command"]
    rdzv_host = f"{job.name}-0.{job.name}.model-factory.svc.cluster.local"
    assert f"--rdzv-endpoint={rdzv_host}:29400" in cmd
    assert "--rdzv-backend=c10d" in cmd and "--nnodes=3" in cmd and "--nproc-per-node=8" in cmd
    assert f"--rdzv-id={job.name}" in cmd
    assert (
        f"--local-addr={job.name}-$({POD_INDEX_ENV}).{job.name}.model-factory.svc.cluster.local"
        in cmd
    )
    assert _container(job_m)["ports"][0]["containerPort"] == svc["spec"]["ports"][0]["port"]


def test_pod_index_comes_from_the_completion_index_annotation(settings):
    env = _env(build_training_job(make_job(nnodes=2), settings))
    ref = env[POD_INDEX_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == f"metadata.annotations['{INDEX_ANNOTATION}']"


def test_only_a_multi_node_gang_turns_off_torchruns_shared_store(settings):
    # Its restart count is per agent, so a restarted multi-pod gang would not meet on it
    # (tests/distributed/test_multinode_restart.py runs the real agents).
    multi = _env(build_training_job(make_job(nnodes=2), settings))
    assert multi["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in _env(build_training_job(make_job(nnodes=1), settings))


def test_rendezvous_host_is_pod_zero_of_the_service(settings):
    job = make_job(nnodes=2)
    assert pod_fqdn(job, settings, 0).startswith(f"{job.name}-0.{job.name}.model-factory.svc.")
    custom = dataclasses.replace(settings, cluster_domain="corp.internal", rendezvous_port=12345)
    cmd = torchrun_args(job, custom)
    assert f"--rdzv-endpoint={job.name}-0.{job.name}.model-factory.svc.corp.internal:12345" in cmd


def test_mig_profile_is_requested_as_its_own_resource(settings):
    job = make_job(nproc=1, resource_name="nvidia.com/mig-1g.10gb")
    m = build_training_job(job, settings)
    validate_all([m])
    res = _container(m)["resources"]
    # A slice is sized as one GPU (recipes on MIG lower memory_gib_per_gpu)
    assert res["limits"] == {"memory": "96Gi", "nvidia.com/mig-1g.10gb": "1"}
    assert "nvidia.com/gpu" not in res["requests"]


def test_cpu_only_job_requests_no_gpu(settings):
    m = build_training_job(make_job(nproc=2, gpus=0), settings)
    validate_all([m])
    assert set(_container(m)["resources"]["requests"]) == {"cpu", "memory"}


def test_tolerations_node_selector_and_priority_reach_the_pod(settings):
    tolerations = (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "pool", "operator": "Equal", "value": "training", "effect": "NoExecute"},
    )
    job = make_job(
        nproc=2,
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=tolerations,
        priority_class="model-factory-training",
    )
    m = build_training_job(job, settings)
    validate_all([m])
    pod = _pod(m)
    assert pod["tolerations"] == [dict(t) for t in tolerations]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["priorityClassName"] == "model-factory-training"


def test_no_priority_class_unless_asked(settings):
    pod = _pod(build_training_job(make_job(), settings))
    assert "priorityClassName" not in pod and "tolerations" not in pod and "nodeSelector" not in pod


@pytest.mark.parametrize("size", ["512Mi", "2Gi", "16Gi"])
def test_shm_is_a_memory_backed_volume_of_the_requested_size(settings, size):
    m = build_training_job(make_job(shm_size=size), settings)
    validate_all([m])
    volumes = {v["name"]: v for v in _pod(m)["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
    mounts = {v["mountPath"]: v["name"] for v in _container(m)["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"


def test_shared_volume_is_mounted_where_the_config_lives(settings):
    job = make_job()
    m = build_training_job(job, settings)
    volumes = {v["name"]: v for v in _pod(m)["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"] == {"claimName": settings.shared_claim}
    mounts = {v["name"]: v["mountPath"] for v in _container(m)["volumeMounts"]}
    assert config_path(job, settings).startswith(mounts["shared"] + "/")


def test_secrets_are_references_never_values(settings):
    m = build_training_job(make_job(), settings, PIPES_ENV)
    env = _env(m)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"] == {
            "name": "model-factory-s3", "key": name, "optional": False
        }
    assert "AWS_SECRET_ACCESS_KEY\": {\"value" not in json.dumps(m)


def test_a_secret_name_set_as_plain_env_is_refused(settings):
    job = dataclasses.replace(make_job(), env={"AWS_SECRET_ACCESS_KEY": "oops"})
    with pytest.raises(ValueError, match="only come from the Secret"):
        build_training_job(job, settings)


def test_nccl_settings_and_pipes_bootstrap_reach_the_trainer(settings):
    nccl = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    m = build_training_job(make_job(nnodes=2, nccl_env=nccl), settings, PIPES_ENV)
    validate_all([m])
    env = _env(m)
    for k, v in {**nccl, **PIPES_ENV}.items():
        assert env[k] == {"name": k, "value": v}


def test_non_nccl_key_in_nccl_env_is_refused(settings):
    with pytest.raises(ValueError, match="not an NCCL setting"):
        build_training_job(make_job(nccl_env={"CUDA_VISIBLE_DEVICES": "0"}), settings)


def test_security_context_is_restricted(settings):
    m = build_training_job(make_job(nnodes=2), settings)
    pod = _pod(m)
    sc = _container(m)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert not any("hostPath" in v for v in pod["volumes"])
    # With a read-only root, everything the runtime writes has a volume or a redirect.
    assert {v["mountPath"] for v in _container(m)["volumeMounts"]} >= {"/tmp", "/dev/shm"}
    assert _env(m)["HOME"]["value"] == "/tmp"


def test_job_cleans_up_after_itself(settings):
    job = make_job(nnodes=2)
    m = build_training_job(job, dataclasses.replace(settings, ttl_seconds_after_finished=600,
                                                    active_deadline_seconds=86400))
    validate_all([m])
    assert m["spec"]["ttlSecondsAfterFinished"] == 600
    assert m["spec"]["activeDeadlineSeconds"] == 86400
    assert m["spec"]["backoffLimit"] == 0
    assert _pod(m)["restartPolicy"] == "Never"


def test_service_owned_by_the_job_once_its_uid_is_known(settings):
    svc = build_headless_service(make_job(nnodes=2), settings, owner_uid="1f2e3d4c-0000-4000-8000-000000000001")
    validate_all([svc])
    (owner,) = svc["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", "digits-1a2b3c4d", "1f2e3d4c-0000-4000-8000-000000000001")


def test_max_restarts_and_image_pull_secrets(settings):
    job = dataclasses.replace(make_job(nnodes=2), max_restarts=3)
    m = build_training_job(job, dataclasses.replace(settings, image_pull_secrets=("regcred",)))
    validate_all([m])
    assert "--max-restarts=3" in _container(m)["command"]
    assert _pod(m)["imagePullSecrets"] == [{"name": "regcred"}]


@pytest.mark.parametrize(
    "name, message",
    [
        ("Digits_Run", "DNS label"),
        ("x" * (MAX_JOB_NAME + 1), "DNS label"),
        ("-leading", "DNS label"),
    ],
)
def test_bad_job_names_are_refused_with_the_fix(settings, name, message):
    with pytest.raises(ValueError, match=message):
        build_training_job(make_job(name=name), settings)


def test_inconsistent_gpu_request_is_refused(settings):
    job = dataclasses.replace(make_job(nnodes=2), nnodes=3)
    with pytest.raises(ValueError, match="gpu.nodes"):
        build_training_job(job, settings)
    with pytest.raises(ValueError, match="nproc_per_node"):
        build_training_job(make_job(nproc=4, gpus=2), settings)


def test_output_paths_must_be_on_the_shared_volume(settings):
    check_paths_on_shared_volume(make_job().config, settings)
    with pytest.raises(ValueError, match="not on the shared volume"):
        check_paths_on_shared_volume({"output_dir": "/tmp/out", "checkpoint": {"dir": "/mnt/training/c"}}, settings)
    with pytest.raises(ValueError, match="checkpoint.dir"):
        check_paths_on_shared_volume({"output_dir": "/mnt/training/o", "checkpoint": {"dir": "/var/c"}}, settings)
    # Traversal out of the mount is caught after normalisation.
    with pytest.raises(ValueError):
        check_paths_on_shared_volume({"output_dir": "/mnt/training/../etc"}, settings)


def test_the_schema_check_is_real():
    """kubernetes-validate rejects what the API server would (guards against a no-op validator)."""
    bad = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
           "spec": {"completions": "two", "template": {"spec": {"containers": []}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    unknown = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
               "spec": {"clusterIp": "None"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, K8S_VERSION, strict=True)
