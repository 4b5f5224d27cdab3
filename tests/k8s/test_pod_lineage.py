"""Lineage from the pod: what the training processes report about themselves (image, build, node,
pod, GPU, torch/CUDA/NCCL), the digest the launcher reads from the pod status, and the lineage row
that shows them. The whole path through a rendered Job runs in test_pod_simulation.py."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
import torch
import torch.distributed as dist

from core.lineage import build_lineage_record, lineage_rows, pod_summary
from resources.k8s.launcher import image_digest, record_image_digests
from resources.k8s.manifests import PodSettings
from tests.cli.records import make_record
from training_runtime.observe.build_info import IMAGE_ENV, NODE_NAME_ENV, POD_NAME_ENV
from training_runtime.distributed.process_group import DistInfo
from training_runtime.observe.pod_lineage import gather_pod_record

DIGEST = "sha256:" + "0123456789abcdef" * 4
BUILD = {"git_sha": "c" * 40, "dirty": False, "user_code": "teams"}


@pytest.mark.parametrize("image_id", [
    f"docker-pullable://registry.example.com/model-factory/training@{DIGEST}",  # dockershim / cri-dockerd
    f"registry.example.com/model-factory/training@{DIGEST}",  # containerd
    DIGEST,  # CRI-O on a locally loaded image
])
def test_the_digest_is_read_from_every_container_runtimes_image_id(image_id):
    assert image_digest(image_id) == DIGEST


def test_an_image_id_without_a_digest_is_an_error():
    with pytest.raises(ValueError, match="no sha256 digest"):
        image_digest("docker://registry.example.com/model-factory/training:latest")


def test_a_gloo_group_reports_its_node_pod_and_versions(monkeypatch, tmp_path):
    monkeypatch.setenv(NODE_NAME_ENV, "gpu-node-7")
    monkeypatch.setenv(POD_NAME_ENV, "digits-0-abcde")
    monkeypatch.setenv(IMAGE_ENV, "registry.example.com/model-factory/training:abc")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        record = gather_pod_record(DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"),
                                            backend="gloo"), BUILD)
    finally:
        dist.destroy_process_group()
    assert record["image"] == "registry.example.com/model-factory/training:abc"
    assert record["build"] == BUILD and record["image_digests"] == []
    assert record["torch"] == torch.__version__ and record["cuda"] == torch.version.cuda
    assert record["nodes"] == ["gpu-node-7"] and record["gpus"] == []  # CPU: no GPU model to name
    assert record["ranks"] == [{"rank": 0, "node": "gpu-node-7", "pod": "digits-0-abcde", "gpu": None}]


def _resolved(tmp_path: Path, **pod) -> Path:
    out = tmp_path / "output"
    out.mkdir()
    (out / "resolved_config.json").write_text(json.dumps({"world_size": 2, **({"pod": pod} if pod else {})}))
    return out


def _context() -> tuple[dg.OpExecutionContext, list[str]]:
    warnings: list[str] = []
    context = dg.build_op_context()
    context.log.warning = warnings.append  # what the step log shows
    return context, warnings


def test_the_launcher_adds_the_digest_the_pods_ran(tmp_path):
    out = _resolved(tmp_path, image="img:1", image_digests=[], build=BUILD)
    context, warnings = _context()
    record_image_digests(context, {"p-0": f"img@{DIGEST}", "p-1": f"img@{DIGEST}"}, out)
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["pod"]["image_digests"] == [DIGEST] and resolved["world_size"] == 2
    assert warnings == []


def test_two_digests_under_one_tag_are_recorded_and_warned_about(tmp_path):
    out = _resolved(tmp_path, image="img:latest", image_digests=[], build=BUILD)
    other = "sha256:" + "f" * 64
    context, warnings = _context()
    record_image_digests(context, {"p-0": f"img@{DIGEST}", "p-1": f"img@{other}"}, out)
    assert json.loads((out / "resolved_config.json").read_text())["pod"]["image_digests"] == sorted([DIGEST, other])
    assert len(warnings) == 1 and "immutable tags" in warnings[0]


def test_an_image_whose_runtime_reports_no_pod_section_must_be_rebuilt(tmp_path):
    out = _resolved(tmp_path)
    context, _ = _context()
    with pytest.raises(RuntimeError, match="rebuild it from helm/images/training.Dockerfile"):
        record_image_digests(context, {"p-0": f"img@{DIGEST}"}, out)


POD = {"image": "registry.example.com/model-factory/training:abc", "image_digests": [DIGEST], "build": BUILD,
       "torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.3", "nodes": ["gpu-a", "gpu-b"],
       "gpus": ["NVIDIA H100 80GB HBM3"], "ranks": []}


def test_the_lineage_shows_the_pods_environment_as_a_row():
    record = make_record(pod=POD)
    rows = {row.field: row.value for row in lineage_rows(record)}
    assert rows["training pods"] == (
        f"registry.example.com/model-factory/training:abc@{DIGEST} built from git {'c' * 40} dirty=False; "
        "torch 2.13.0+cu128, CUDA 12.8, NCCL 2.27.3; GPU NVIDIA H100 80GB HBM3; nodes gpu-a, gpu-b")
    assert "training pods" not in {row.field for row in lineage_rows(make_record())}  # older records: no row


def test_a_local_launch_says_it_ran_no_image():
    local = {**POD, "image": None, "image_digests": [], "build": None, "cuda": None, "nccl": None, "gpus": [],
             "nodes": ["laptop"]}
    assert pod_summary(local) == ("no image (local launch) (no build record); torch 2.13.0+cu128, CUDA None, "
                                  "NCCL None; GPU none (CPU); nodes laptop")


def test_the_lineage_record_carries_the_pod_section_of_the_resolved_config():
    record = build_lineage_record(
        model="toy", version=1, checkpoint={"weights_uri": "file:///w", "weights_sha256": "a" * 64,
                                            "weights_path": "models/toy/w", "commit_id": "c" * 64},
        shards={"dataset": "toy", "commit_id": "2" * 64, "manifest_path": "m.json"}, raw={"commit_id": "1" * 64},
        store_facts={}, resolved_config={"world_size": 2, "pod": POD}, metrics={}, evaluation={"test": {}},
        gate={"passed": True}, run_id="r", run_url="http://dagster/runs/r")
    assert record["pod"] == POD


def test_the_pod_learns_its_image_node_and_name_from_its_manifest():
    from resources.k8s.manifests import build_training_job
    from tests.k8s.helpers import make_job, validate_all

    settings = PodSettings(namespace="model-factory", image="registry.example.com/model-factory/training:abc")
    manifest = build_training_job(make_job(nproc=2), settings)
    validate_all([manifest])
    env = {e["name"]: e for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[IMAGE_ENV]["value"] == settings.image
    assert env[NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env[POD_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
