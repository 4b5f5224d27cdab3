"""GPU figures for the telemetry payload: NVML (nvidia-ml-py) where it works, torch's own memory
counters always, and a one-time warning for every figure that is unavailable.

Nothing here may stop a training run: NVML missing (no ``pynvml``, no ``libnvidia-ml.so.1``, a
ROCm build), a device NVML cannot find, or a query a device does not support (MIG slices have no
utilisation counter) each degrade to the figures that remain and say so once.

Nothing here synchronises the device either: NVML reads driver state, and torch's
``memory_allocated``/``memory_reserved``/``max_memory_allocated`` read the caching allocator's
host-side counters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

# Clock-event (formerly "throttle") reason bits, as in nvml.h. The values are ABI-stable, and the
# newer ``nvmlClocksEventReason*`` names in the bindings drop the last two, so they live here.
_CLOCK_EVENT_REASONS: dict[int, str] = {
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000010: "sync_boost",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
    0x0000000000000100: "display_clock_setting",
    0x0000000000000200: "board_limit",
    0x0000000000000400: "reliability",
}
# Not reported: "GPU idle" (0x1) only says no kernel was running at that instant, which between
# steps is expected, and "applications clocks setting" (0x2) is set whenever clocks sit at the
# administrator's configured application clocks, the normal state of many datacenter GPUs.
# Neither is a slowdown of the work; reporting them would make every sample look throttled.
_BENIGN_CLOCK_EVENT_BITS = 0x0000000000000001 | 0x0000000000000002

# What NVML alone provides; said once when NVML as a whole is unavailable.
_NVML_ONLY_FIGURES = ("gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_temperature_c",
                      "gpu_power_watts", "gpu_throttle_reasons")


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Readable names of the slowdown bits in an NVML clock-event/throttle reason mask, in bit
    order; the benign idle and application-clock bits are left out, an unknown bit is named by its
    value so nothing is hidden."""
    names = []
    remaining = int(mask) & ~_BENIGN_CLOCK_EVENT_BITS
    bit = 1
    while remaining:
        if remaining & bit:
            names.append(_CLOCK_EVENT_REASONS.get(bit, f"unknown_{bit:#x}"))
            remaining &= ~bit
        bit <<= 1
    return names


def nvml_device_candidates(cuda_index: int, torch_uuid: str | None,
                           visible_devices: str | None) -> list[int | str]:
    """NVML device identifiers to try, best first, for CUDA ordinal ``cuda_index``: an ``int`` is
    an NVML index, a ``str`` a UUID for ``nvmlDeviceGetHandleByUUID``.

    The UUID torch reports for the device is preferred because it does not depend on how
    CUDA_VISIBLE_DEVICES is written, nor on CUDA_DEVICE_ORDER (CUDA's default order may differ
    from NVML's PCI order). torch prints it bare, NVML wants "GPU-" or "MIG-" in front; the MIG form
    is tried first because on a MIG slice CUDA may report either the slice's UUID or its parent
    GPU's, and the parent's would give whole-GPU figures. CUDA_VISIBLE_DEVICES is the fallback:
    its entry for this ordinal is an NVML index or a full GPU-/MIG- UUID. The bare ordinal is used
    only when CUDA_VISIBLE_DEVICES is unset, i.e. every GPU is visible.
    """
    visible = None if visible_devices is None or not visible_devices.strip() else \
        [p.strip() for p in visible_devices.split(",")]
    entry = visible[cuda_index] if visible is not None and cuda_index < len(visible) else None
    candidates: list[int | str] = []
    if torch_uuid:
        candidates.append(f"MIG-{torch_uuid}")
        if entry is not None and entry.startswith("MIG-"):
            candidates.append(entry)  # CUDA reported the parent's UUID; the env names the slice
        candidates.append(f"GPU-{torch_uuid}")
    if visible is None:
        candidates.append(cuda_index)
    elif entry is not None and entry.isdigit():
        candidates.append(int(entry))
    elif entry is not None and entry.startswith(("GPU-", "MIG-")) and entry not in candidates:
        candidates.append(entry)
    return candidates


@dataclass(frozen=True)
class _Figure:
    """One NVML query and the payload keys it fills; dropped as a whole when the query fails."""
    keys: tuple[str, ...]
    query: str  # the NVML function, named in the warning
    read: Callable[[], dict[str, Any]]


class GpuStats:
    """The GPU figures of one CUDA device for ``SystemStats``.

    ``nvml`` is the ``pynvml`` module or an object with the same functions and ``NVMLError``
    classes (tests pass a fake); ``None`` imports ``pynvml``. ``warn`` receives each one-line
    degradation message, once per missing figure.
    """

    def __init__(self, device: torch.device, *, nvml: Any = None, warn: Callable[[str], None]):
        self.cuda_index = device.index if device.index is not None else torch.cuda.current_device()
        self.label = f"cuda:{self.cuda_index}"
        self._warn = warn
        props = torch.cuda.get_device_properties(self.cuda_index)
        self._torch_total_bytes = int(props.total_memory)
        torch_uuid = str(props.uuid) if getattr(props, "uuid", None) is not None else None
        # Without NVML the name and bare UUID come from torch (which cannot tell a MIG slice).
        self.name: str = props.name
        self.uuid: str | None = torch_uuid
        self.source = "torch"
        self.nvml: Any = None
        self._figures: list[_Figure] = []
        nv, why_not = _load_nvml(nvml)
        if nv is not None:
            handle, why_not = self._resolve(nv, torch_uuid)
            if handle is not None:
                self._start_nvml(nv, handle, torch_uuid)
            else:
                _shutdown_quietly(nv)
        if why_not is not None:
            self._warn(f"GPU telemetry on {self.label}: NVML unavailable ({why_not}); reporting "
                       f"torch's memory counters only, without {', '.join(_NVML_ONLY_FIGURES)}")

    def _resolve(self, nv: Any, torch_uuid: str | None) -> tuple[Any, str | None]:
        """The NVML handle of this device, or None and why it could not be found."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        candidates = nvml_device_candidates(self.cuda_index, torch_uuid, visible)
        errors = []
        for ident in candidates:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(ident) if isinstance(ident, int) \
                    else nv.nvmlDeviceGetHandleByUUID(ident)
            except nv.NVMLError as err:
                errors.append(f"{ident}: {err}")
                continue
            return handle, None
        if not candidates:
            return None, (f"CUDA_VISIBLE_DEVICES={visible!r} has no NVML index or full GPU-/MIG- "
                          f"UUID for CUDA ordinal {self.cuda_index}; list full UUIDs or indices")
        return None, "no NVML device matches (" + "; ".join(errors) + ")"

    def _start_nvml(self, nv: Any, handle: Any, torch_uuid: str | None) -> None:
        self.nvml, self.source = nv, "nvml"
        self.name = _text(_try(nv, nv.nvmlDeviceGetName, handle)) or self.name
        self.uuid = _text(_try(nv, nv.nvmlDeviceGetUUID, handle)) or self.uuid
        is_mig = bool(_as_int(_try(nv, getattr(nv, "nvmlDeviceIsMigDeviceHandle", None), handle)))
        # Temperature and clock slowdowns belong to the board a MIG slice runs on; a MIG handle
        # does not report them, its parent does. Power stays per handle: the board's draw is
        # shared by every slice, so it would be misattributed to this one.
        board = _try(nv, nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, handle) if is_mig else None
        board = board if board is not None else handle
        if is_mig:
            self.label += " (MIG slice)"
        board_uuid = _text(_try(nv, nv.nvmlDeviceGetUUID, board)) if is_mig else None
        if torch_uuid and not any(u and u.lower().endswith(torch_uuid.lower())
                                  for u in (self.uuid, board_uuid)):
            # Only the CUDA_VISIBLE_DEVICES / ordinal fallback can get here.
            self._warn(f"GPU telemetry on {self.label}: NVML has no device with torch's UUID "
                       f"{torch_uuid}; reporting NVML device {self.uuid} found through "
                       f"CUDA_VISIBLE_DEVICES, which may be a different GPU")
        self._figures = [
            _Figure(("gpu_utilization_percent",), "nvmlDeviceGetUtilizationRates",
                    lambda: {"gpu_utilization_percent": nv.nvmlDeviceGetUtilizationRates(handle).gpu}),
            _Figure(("gpu_memory_used_bytes", "gpu_memory_total_bytes"), "nvmlDeviceGetMemoryInfo",
                    lambda: _memory(nv, handle)),
            _Figure(("gpu_temperature_c",), "nvmlDeviceGetTemperature",
                    lambda: {"gpu_temperature_c":
                             nv.nvmlDeviceGetTemperature(board, nv.NVML_TEMPERATURE_GPU)}),
            _Figure(("gpu_power_watts",), "nvmlDeviceGetPowerUsage",
                    lambda: {"gpu_power_watts": nv.nvmlDeviceGetPowerUsage(handle) / 1000.0}),
            _Figure(("gpu_throttle_reasons",), "nvmlDeviceGetCurrentClocksEventReasons",
                    lambda: {"gpu_throttle_reasons":
                             decode_clock_event_reasons(_clock_event_reasons(nv, board))}),
        ]

    def describe(self) -> dict[str, Any]:
        """Which GPU this is: name, UUID (NVML's "GPU-…"/"MIG-…" form, or torch's bare UUID
        without NVML) and where the figures come from ("nvml" or "torch")."""
        return {"gpu_name": self.name, "gpu_uuid": self.uuid, "gpu_stats_source": self.source}

    def sample(self) -> dict[str, Any]:
        """torch's allocator counters and total, then every NVML figure still available (NVML's
        total, the slice's on MIG, wins over torch's)."""
        i = self.cuda_index
        out: dict[str, Any] = {
            "gpu_memory_allocated_bytes": torch.cuda.memory_allocated(i),
            "gpu_memory_reserved_bytes": torch.cuda.memory_reserved(i),
            "gpu_memory_peak_allocated_bytes": torch.cuda.max_memory_allocated(i),
            "gpu_memory_total_bytes": self._torch_total_bytes,
        }
        for figure in list(self._figures):
            try:
                out.update(figure.read())
            except self.nvml.NVMLError as err:
                self._figures.remove(figure)
                self._warn(f"GPU telemetry on {self.label}: dropping {', '.join(figure.keys)} from "
                           f"now on, {figure.query} failed: {_reason(self.nvml, err)}")
        return out

    def close(self) -> None:
        """Shut NVML down once; later calls do nothing."""
        if self.nvml is not None:
            _shutdown_quietly(self.nvml)
            self.nvml, self._figures = None, []


def _load_nvml(nvml: Any) -> tuple[Any, str | None]:
    """The initialised NVML module, or None and why not."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as err:
            return None, f"cannot import pynvml: {err}; install nvidia-ml-py"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        fix = ("; the image needs the driver's libnvidia-ml.so.1 (run with the NVIDIA container "
               "runtime)" if isinstance(err, nvml.NVMLError_LibraryNotFound) else "")
        return None, f"nvmlInit failed: {err}{fix}"
    return nvml, None


def _memory(nv: Any, handle: Any) -> dict[str, int]:
    mem = nv.nvmlDeviceGetMemoryInfo(handle)
    return {"gpu_memory_used_bytes": int(mem.used), "gpu_memory_total_bytes": int(mem.total)}


def _clock_event_reasons(nv: Any, handle: Any) -> int:
    """The clock-event mask; the older "throttle" name where the bindings or the driver (before
    R535) lack nvmlDeviceGetCurrentClocksEventReasons."""
    query = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if query is not None:
        try:
            return query(handle)
        except nv.NVMLError_FunctionNotFound:
            pass
    return nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


def _reason(nv: Any, err: Exception) -> str:
    if isinstance(err, nv.NVMLError_NotSupported):
        return f"{err} (MIG slices and some virtual GPUs do not expose it)"
    return str(err)


def _try(nv: Any, query: Callable[[Any], Any] | None, handle: Any) -> Any:
    """An optional descriptive query: its value, or None when missing or failing."""
    if query is None:
        return None
    try:
        return query(handle)
    except nv.NVMLError:
        return None


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _as_int(value: Any) -> int:
    """ctypes results (nvmlDeviceIsMigDeviceHandle returns a c_uint) or plain ints."""
    return int(getattr(value, "value", value) or 0)


def _shutdown_quietly(nv: Any) -> None:
    # At the end of a run a failing shutdown changes nothing; the process is about to exit.
    try:
        nv.nvmlShutdown()
    except nv.NVMLError:
        pass
