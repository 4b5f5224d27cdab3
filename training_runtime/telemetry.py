"""Run reporting: a plain-logging reporter (a Pipes one lives in ``pipes.py``), process and GPU
statistics, and the rank-0 progress line."""

from __future__ import annotations

import datetime
import json
import logging
import os
from typing import Any, Protocol

import torch

log = logging.getLogger("training_runtime")


class Reporter(Protocol):
    def info(self, message: str) -> None: ...
    def custom(self, payload: dict[str, Any]) -> None: ...


class LogReporter:
    """Reports to the ``training_runtime`` logger (stderr) when not launched by Dagster."""

    def info(self, message: str) -> None:
        log.info(message)

    def custom(self, payload: dict[str, Any]) -> None:
        log.info("%s %s", payload.get("kind", "message"), json.dumps(payload, sort_keys=True))


class SystemStats:
    """CPU percent and RSS of this process (psutil); GPU utilisation, memory and temperature
    through nvidia-ml-py when the device is CUDA."""

    def __init__(self, device: torch.device):
        import psutil

        self.proc = psutil.Process()
        self.proc.cpu_percent(None)
        self.nvml_handle = None
        if device.type == "cuda":
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.nvml_handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(device.index or 0))

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_percent": self.proc.cpu_percent(None),
                               "rss_bytes": self.proc.memory_info().rss}
        if self.nvml_handle is not None:
            nv, h = self.nvml, self.nvml_handle
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.update(gpu_utilization_percent=util.gpu, gpu_memory_used_bytes=mem.used,
                       gpu_memory_total_bytes=mem.total,
                       gpu_temperature_c=nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        return out

    def close(self) -> None:
        if self.nvml_handle is not None:
            self.nvml.nvmlShutdown()
            self.nvml_handle = None


def _nvml_index(cuda_index: int) -> int:
    """Map a CUDA ordinal to an NVML index through CUDA_VISIBLE_DEVICES when it lists ordinals."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts) and cuda_index < len(parts):
        return int(parts[cuda_index])
    return cuda_index


def progress_line(*, epoch: int, epochs: int, step: int, total: int, loss: float,
                  samples_per_second: float, elapsed_s: float, start_step: int = 0,
                  width: int = 20) -> str:
    """One text progress-bar line; the ETA extrapolates this attempt's pace (from start_step)."""
    frac = step / total if total else 1.0
    filled = int(round(frac * width))
    done = step - start_step
    eta = elapsed_s * (total - step) / done if done > 0 else 0.0
    eta_s = str(datetime.timedelta(seconds=int(eta)))
    return (f"epoch {epoch}/{epochs} [{'#' * filled}{'.' * (width - filled)}] step {step}/{total} "
            f"({frac:.0%}) loss {loss:.4f} {samples_per_second:,.0f} samples/s ETA {eta_s}")
