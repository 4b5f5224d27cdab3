"""The decisions the runtime takes for GPUs, tested without one: device and backend choice, the
ordinal check, FSDP's mixed precision and HSDP mesh, numeric settings, the copy stream's logic,
timeouts, and old checkpoints' fingerprints."""

import contextlib

import pytest
import torch

from training_runtime.config import ConfigError, RunConfig, TrainConfig
from training_runtime.train.context import training_fingerprint
from training_runtime.data.device_copy import DeviceCopier
from training_runtime.distributed.process_group import (
    DeviceError,
    choose_device,
    cuda_unavailable_reason,
    init_distributed,
)
from training_runtime.distributed.fsdp import fsdp_mesh_shape, mixed_precision_policy
from training_runtime.train.numerics import CUBLAS_DETERMINISTIC_WORKSPACE, numeric_settings
from tests.runtime.helpers import make_config, make_dataset


# ------------------------------------------------------------------ device choice
def test_cpu_is_chosen_without_asking_cuda():
    assert choose_device("cpu", local_rank=3, local_world_size=8, unavailable=None, device_count=8).type == "cpu"


def test_auto_falls_back_to_cpu_only_when_cuda_is_unusable():
    assert choose_device("auto", local_rank=0, local_world_size=1, unavailable="no driver",
                         device_count=0) == torch.device("cpu")
    assert choose_device("auto", local_rank=1, local_world_size=2, unavailable=None,
                         device_count=2) == torch.device("cuda", 1)


def test_requested_cuda_that_fails_to_start_is_an_error_with_the_reason():
    with pytest.raises(DeviceError, match=r"train.device is 'cuda'.*driver too old.*device plugin"):
        choose_device("cuda", local_rank=0, local_world_size=1, unavailable="driver too old", device_count=0)


@pytest.mark.parametrize("local_rank,local_world", [(1, 2), (0, 2)])
def test_more_ranks_than_gpus_is_refused_before_any_invalid_ordinal(local_rank, local_world, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(DeviceError, match=r"2 rank\(s\) per node.*shows 1 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0\)"
                                          r".*gpus_per_node.*at most 1"):
        choose_device("cuda", local_rank=local_rank, local_world_size=local_world, unavailable=None, device_count=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build's message")
def test_this_cpu_build_says_why_cuda_cannot_be_used_and_init_refuses_cuda():
    assert "no CUDA support" in cuda_unavailable_reason()
    with pytest.raises(DeviceError, match="no CUDA support"):
        init_distributed("cuda")
    assert not torch.distributed.is_initialized()  # refused before any process group


def test_empty_visible_devices_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES is empty" in cuda_unavailable_reason()


# ------------------------------------------------------------------ FSDP
def test_fsdp_mesh_spans_every_rank_and_hsdp_shards_within_a_node():
    assert fsdp_mesh_shape("fsdp", 16, 8) == (16,)
    assert fsdp_mesh_shape("hsdp", 16, 8) == (2, 8)  # replicate across 2 nodes, shard over 8 GPUs
    assert fsdp_mesh_shape("hsdp", 4, 4) == (1, 4)
    with pytest.raises(ValueError, match="same number of ranks on every node"):
        fsdp_mesh_shape("hsdp", 12, 8)
    with pytest.raises(ValueError, match="no FSDP mesh"):
        fsdp_mesh_shape("ddp", 2, 2)


def test_bf16_policy_computes_in_bf16_and_reduces_in_fp32():
    assert mixed_precision_policy("fp32") is None
    p = mixed_precision_policy("bf16")
    assert (p.param_dtype, p.reduce_dtype, p.output_dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert mixed_precision_policy("bf16", root=False).output_dtype is None


# ------------------------------------------------------------------ numerics
def test_numeric_settings_for_speed_and_for_determinism():
    fast = numeric_settings(tf32=True, deterministic=False, environ_cublas=None)
    assert fast.float32_matmul_precision == "high" and fast.cudnn_benchmark and fast.cublas_workspace_config is None
    exact = numeric_settings(tf32=False, deterministic=True, environ_cublas=None)
    assert exact.float32_matmul_precision == "highest" and not exact.cudnn_benchmark and exact.deterministic
    assert exact.cublas_workspace_config == CUBLAS_DETERMINISTIC_WORKSPACE
    assert numeric_settings(tf32=True, deterministic=True, environ_cublas=":16:8").cublas_workspace_config == ":16:8"


# ------------------------------------------------------------------ copy stream
class RecordingStreams:
    """Stands in for CUDA streams: records the order of the calls the copier makes."""

    def __init__(self):
        self.events, self.current_stream = [], "compute"

    def new_stream(self, device):
        return "copy"

    @contextlib.contextmanager
    def use(self, stream):
        previous, self.current_stream = self.current_stream, stream
        self.events.append(("enter", stream))
        yield
        self.current_stream = previous
        self.events.append(("exit", stream))

    def current(self, device):
        streams = self

        class Stream:
            def wait_stream(self, other):
                streams.events.append(("wait", "compute", other))

        return Stream()

    def record(self, tensor, stream):
        self.events.append(("record", tuple(tensor.shape)))


def test_batches_are_copied_on_the_side_stream_and_the_compute_stream_waits_for_them():
    streams = RecordingStreams()
    copied_on = []
    copier = DeviceCopier(torch.device("cpu"), streams,
                          move=lambda t: copied_on.append(streams.current_stream) or t.clone())
    batch = {"input": torch.zeros(4, 3), "target": torch.zeros(4), "ids": ["a", "b", "c", "d"]}
    out = copier(batch)
    assert copied_on == ["copy", "copy"]  # both tensors moved while the copy stream was current
    assert out["ids"] == batch["ids"] and out["input"] is not batch["input"]
    names = [e[0] for e in streams.events]
    assert names == ["enter", "exit", "wait", "record", "record"]  # wait before any use, then record_stream
    assert streams.events[2] == ("wait", "compute", "copy")


def test_on_cpu_batches_pass_through_untouched():
    batch = {"input": torch.zeros(2)}
    assert DeviceCopier(torch.device("cpu"))(batch) is batch


# ------------------------------------------------------------------ settings and checkpoints
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_ready")
    manifest, locations = make_dataset(root)
    return root, manifest, locations


@pytest.mark.parametrize("field,value,message", [
    ("device", "tpu", "train.device must be one of"),
    ("grad_clip_norm", 0.0, "train.grad_clip_norm must be a positive finite number"),
    ("collective_timeout_s", -1.0, "train.collective_timeout_s must be a positive number"),
    ("io_timeout_s", float("inf"), "train.io_timeout_s must be a positive number"),
    ("sharding", "zero3", "train.sharding must be one of"),
])
def test_bad_gpu_settings_name_the_field(dataset, field, value, message):
    root, manifest, locations = dataset
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(make_config(root, manifest, locations, **{field: value}))


def test_a_checkpoint_written_before_the_new_settings_still_resumes(dataset):
    root, manifest, locations = dataset
    new = RunConfig.from_dict(make_config(root, manifest, locations)).to_dict()
    old = {**new, "train": {k: v for k, v in new["train"].items()
                            if k not in ("device", "tf32", "deterministic", "grad_clip_norm", "compile",
                                         "collective_timeout_s", "io_timeout_s")}}
    assert training_fingerprint(old) == training_fingerprint(new)
    # Settings that change the numbers still refuse a resume; those that change only speed do not.
    assert training_fingerprint({**new, "train": {**new["train"], "deterministic": True}}) != training_fingerprint(new)
    assert training_fingerprint({**new, "train": {**new["train"], "device": "cuda", "compile": True}}) \
        == training_fingerprint(new)


def test_defaults_keep_fp32_semantics_with_tf32_and_bounded_waits():
    t = TrainConfig()
    assert t.device == "auto" and t.tf32 and not t.deterministic and t.grad_clip_norm is None
    assert t.io_timeout_s > t.collective_timeout_s
