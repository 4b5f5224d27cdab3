"""GPU telemetry degrades instead of killing rank 0: a fake NVML module (raising the real pynvml
error classes) stands in for the driver, and torch's CUDA counters are monkeypatched since the
test machine has no GPU. One test samples the real NVML where a GPU is present."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pynvml
import pytest
import torch

from training_runtime.observe.gpu_stats import decode_clock_event_reasons, nvml_device_candidates
from training_runtime.observe.telemetry import SystemStats

TORCH_UUID = "8a1c2f3e-0000-4000-8000-00000000beef"
OTHER_UUID = "11111111-2222-4333-8444-555555555555"
GiB = 2**30


class FakeNvml:
    """The few pynvml functions SystemStats uses, over a table of devices keyed by NVML UUID.
    ``unsupported`` names functions that raise NVMLError_NotSupported; every call is counted."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, devices: list[dict] | None = None, *, init_error: type | None = None,
                 unsupported: tuple[str, ...] = (), clock_reasons: int = 0):
        self.devices = devices if devices is not None else [{"uuid": f"GPU-{TORCH_UUID}"}]
        self.init_error = init_error
        self.unsupported = set(unsupported)
        self.clock_reasons = clock_reasons
        self.calls: dict[str, int] = {}
        self.uuid_lookups: list[str] = []
        self.index_lookups: list[int] = []

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.unsupported:
            raise pynvml.NVMLError_NotSupported()

    def _device(self, handle: int) -> dict:
        return self.devices[handle]

    def nvmlInit(self):
        self._call("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        self.index_lookups.append(index)
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError_InvalidArgument()
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._call("nvmlDeviceGetHandleByUUID")
        self.uuid_lookups.append(uuid)
        for handle, dev in enumerate(self.devices):
            if dev["uuid"] == uuid:
                return handle
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetName(self, handle):
        self._call("nvmlDeviceGetName")
        return self._device(handle).get("name", "NVIDIA H100 80GB HBM3")

    def nvmlDeviceGetUUID(self, handle):
        self._call("nvmlDeviceGetUUID")
        return self._device(handle)["uuid"]

    def nvmlDeviceIsMigDeviceHandle(self, handle):
        self._call("nvmlDeviceIsMigDeviceHandle")
        return int("parent" in self._device(handle))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle):
        self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return self._device(handle)["parent"]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=87 + handle, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=(30 + handle) * GiB, total=(80 - handle) * GiB, free=0)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._call("nvmlDeviceGetTemperature")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 61 + handle

    def nvmlDeviceGetPowerUsage(self, handle):
        self._call("nvmlDeviceGetPowerUsage")
        return 312_500 + handle  # milliwatts

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return self.clock_reasons


class ThrottleOnlyNvml(FakeNvml):
    """Bindings older than the "clock events" rename: only the throttle-reasons query exists."""

    nvmlDeviceGetCurrentClocksEventReasons = None

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        self._call("nvmlDeviceGetCurrentClocksThrottleReasons")
        return self.clock_reasons


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as it would look on a GPU machine, for the few calls SystemStats makes."""
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid=TORCH_UUID, total_memory=79 * GiB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 5 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 6 * GiB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: 7 * GiB)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return props


def make_stats(nvml, index=0):
    warnings: list[str] = []
    stats = SystemStats(torch.device("cuda", index), nvml=nvml, warn=warnings.append)
    return stats, warnings


def test_all_figures_when_nvml_supports_everything(fake_cuda):
    nvml = FakeNvml(clock_reasons=0x1 | 0x4)
    stats, warnings = make_stats(nvml)
    sample = stats.sample()
    assert warnings == []
    assert sample["gpu_utilization_percent"] == 87
    assert sample["gpu_memory_used_bytes"] == 30 * GiB
    assert sample["gpu_memory_total_bytes"] == 80 * GiB  # NVML's total wins over torch's 79
    assert sample["gpu_temperature_c"] == 61
    assert sample["gpu_power_watts"] == pytest.approx(312.5)
    assert sample["gpu_throttle_reasons"] == ["sw_power_cap"]
    assert (sample["gpu_memory_allocated_bytes"], sample["gpu_memory_reserved_bytes"],
            sample["gpu_memory_peak_allocated_bytes"]) == (5 * GiB, 6 * GiB, 7 * GiB)
    assert sample["cpu_percent"] >= 0 and sample["rss_bytes"] > 0
    assert stats.describe() == {"gpu_name": "NVIDIA H100 80GB HBM3",
                                "gpu_uuid": f"GPU-{TORCH_UUID}", "gpu_stats_source": "nvml"}


def test_mig_slice_without_utilization_keeps_other_figures_and_warns_once(fake_cuda):
    # Device 0 is the board, device 1 the MIG slice torch runs on; the slice has no utilisation
    # or power counter, and its temperature and clock events come from the board.
    nvml = FakeNvml([{"uuid": f"GPU-{OTHER_UUID}"},
                     {"uuid": f"MIG-{TORCH_UUID}", "parent": 0, "name": "NVIDIA A100 MIG 1g.10gb"}],
                    unsupported=("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage"),
                    clock_reasons=0x40)
    stats, warnings = make_stats(nvml)
    samples = [stats.sample() for _ in range(3)]
    for sample in samples:
        assert "gpu_utilization_percent" not in sample and "gpu_power_watts" not in sample
        assert sample["gpu_memory_used_bytes"] == 31 * GiB  # the slice's, not the board's
        assert sample["gpu_temperature_c"] == 61  # the board's
        assert sample["gpu_throttle_reasons"] == ["hw_thermal_slowdown"]
    assert len(warnings) == 2, warnings
    assert "gpu_utilization_percent" in warnings[0] and "Not Supported" in warnings[0]
    assert "MIG slice" in warnings[0] and "gpu_power_watts" in warnings[1]
    # A dropped figure is not queried again.
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 1
    assert stats.describe()["gpu_uuid"] == f"MIG-{TORCH_UUID}"


def test_nvml_init_failure_falls_back_to_torch_counters(fake_cuda):
    nvml = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    stats, warnings = make_stats(nvml)
    samples = [stats.sample() for _ in range(2)]
    assert len(warnings) == 1
    assert "NVML Shared Library Not Found" in warnings[0] and "libnvidia-ml.so.1" in warnings[0]
    assert "gpu_utilization_percent" in warnings[0] and "gpu_temperature_c" in warnings[0]
    for sample in samples:
        assert sample["gpu_memory_total_bytes"] == 79 * GiB
        assert sample["gpu_memory_allocated_bytes"] == 5 * GiB
        assert not {"gpu_utilization_percent", "gpu_temperature_c", "gpu_power_watts",
                    "gpu_throttle_reasons", "gpu_memory_used_bytes"} & sample.keys()
    assert stats.describe() == {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_uuid": TORCH_UUID,
                                "gpu_stats_source": "torch"}
    stats.close()
    assert "nvmlShutdown" not in nvml.calls  # nothing was initialised


def test_missing_pynvml_falls_back_with_install_hint(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    stats, warnings = make_stats(None)
    assert stats.sample()["gpu_memory_reserved_bytes"] == 6 * GiB
    assert len(warnings) == 1 and "nvidia-ml-py" in warnings[0]


def test_uuid_in_cuda_visible_devices_maps_through_get_handle_by_uuid(fake_cuda, monkeypatch):
    # An older torch without props.uuid: the mapping falls back to CUDA_VISIBLE_DEVICES.
    fake_cuda.uuid = None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"GPU-{OTHER_UUID},GPU-{TORCH_UUID}")
    nvml = FakeNvml([{"uuid": f"GPU-{TORCH_UUID}"}, {"uuid": f"GPU-{OTHER_UUID}"}])
    stats, warnings = make_stats(nvml, index=1)
    assert nvml.uuid_lookups == [f"GPU-{TORCH_UUID}"] and nvml.index_lookups == []
    assert stats.sample()["gpu_utilization_percent"] == 87  # NVML device 0
    assert warnings == []


def test_torch_uuid_wins_over_numeric_cuda_visible_devices(fake_cuda, monkeypatch):
    # CUDA's fastest-first order can differ from NVML's PCI order; torch's UUID is unambiguous.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    nvml = FakeNvml([{"uuid": f"GPU-{OTHER_UUID}"}, {"uuid": f"GPU-{TORCH_UUID}"}])
    stats, warnings = make_stats(nvml)
    assert stats.sample()["gpu_utilization_percent"] == 88  # NVML device 1, not index 0
    assert nvml.index_lookups == [] and warnings == []


def test_unknown_torch_uuid_falls_back_to_env_and_says_so(fake_cuda, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml = FakeNvml([{"uuid": f"GPU-{OTHER_UUID}"}, {"uuid": "GPU-99999999-0000-4000-8000-0"}])
    stats, warnings = make_stats(nvml)
    assert nvml.index_lookups == [1] and stats.sample()["gpu_temperature_c"] == 62
    assert len(warnings) == 1 and "may be a different GPU" in warnings[0]


def test_device_nvml_cannot_find_falls_back_to_torch(fake_cuda, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a1c")  # a prefix CUDA accepts, NVML does not
    nvml = FakeNvml([{"uuid": f"GPU-{OTHER_UUID}"}])
    stats, warnings = make_stats(nvml)
    assert "gpu_memory_used_bytes" not in stats.sample()
    assert len(warnings) == 1 and "no NVML device matches" in warnings[0]
    assert nvml.calls["nvmlShutdown"] == 1  # the init that found nothing is undone


def test_candidates_cover_every_cuda_visible_devices_form():
    assert nvml_device_candidates(0, None, None) == [0]
    assert nvml_device_candidates(1, None, "2,3") == [3]
    assert nvml_device_candidates(1, None, "GPU-a,MIG-b") == ["MIG-b"]
    assert nvml_device_candidates(2, None, "2,3") == []
    assert nvml_device_candidates(0, None, "GPU-8a1c") == ["GPU-8a1c"]
    assert nvml_device_candidates(0, None, "") == [0]  # blank reads as unset
    assert nvml_device_candidates(0, "u", "MIG-s") == ["MIG-u", "MIG-s", "GPU-u"]
    assert nvml_device_candidates(0, "u", None) == ["MIG-u", "GPU-u", 0]


@pytest.mark.parametrize("mask, names", [
    (0, []),
    (0x1 | 0x2, []),  # idle and application clocks are benign
    (0x4 | 0x20 | 0x1, ["sw_power_cap", "sw_thermal_slowdown"]),
    (0x8 | 0x80 | 0x200 | 0x400, ["hw_slowdown", "hw_power_brake_slowdown", "board_limit",
                                  "reliability"]),
    (0x10 | 0x100 | 0x1000, ["sync_boost", "display_clock_setting", "unknown_0x1000"]),
])
def test_clock_event_reasons_decode(mask, names):
    assert decode_clock_event_reasons(mask) == names


def test_throttle_reasons_query_on_older_bindings(fake_cuda):
    nvml = ThrottleOnlyNvml(clock_reasons=0x40 | 0x2)
    stats, warnings = make_stats(nvml)
    assert stats.sample()["gpu_throttle_reasons"] == ["hw_thermal_slowdown"]
    assert warnings == []


def test_close_is_idempotent(fake_cuda):
    nvml = FakeNvml()
    stats, _ = make_stats(nvml)
    stats.close()
    stats.close()
    assert nvml.calls["nvmlShutdown"] == 1
    assert "gpu_utilization_percent" not in stats.sample()  # after close only torch's counters


def test_cpu_device_has_no_gpu_figures():
    stats = SystemStats(torch.device("cpu"), warn=pytest.fail)
    assert set(stats.sample()) == {"cpu_percent", "rss_bytes"} and stats.describe() == {}
    stats.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and its NVML")
def test_real_nvml_on_a_gpu():
    warnings: list[str] = []
    stats = SystemStats(torch.device("cuda", 0), warn=warnings.append)
    try:
        first = stats.sample()
        block = torch.ones(1 << 20, device="cuda")  # 4 MiB through torch's allocator
        torch.cuda.synchronize()
        second = stats.sample()
    finally:
        stats.close()
        stats.close()
    described = stats.describe()
    assert described["gpu_stats_source"] == "nvml", warnings
    assert described["gpu_uuid"].startswith(("GPU-", "MIG-")) and described["gpu_name"]
    assert second["gpu_memory_total_bytes"] > 0 and 0 < second["gpu_memory_used_bytes"]
    assert second["gpu_memory_allocated_bytes"] >= block.numel() * block.element_size()
    assert isinstance(second.get("gpu_throttle_reasons", []), list)
    # A figure the device lacks is dropped with one message, not one per sample.
    assert len(warnings) == len(set(warnings)) and first.keys() >= second.keys()
    print("real NVML sample:", described, second, warnings)
