"""Run reporting: a plain-logging reporter (a Pipes one lives in ``pipes.py``), process and GPU
statistics, and the rank-0 progress line."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Callable, Protocol

import torch

from training_runtime.observe.gpu_stats import GpuStats

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

    def failed(self, kind: str) -> None:
        """This rank failed, of ``kind`` (train/failures.py): nothing to add here."""

    def recorded(self) -> None:
        """This rank's failure is in its attempt's records (train/failures.py): nothing to add here."""

    def restarting(self, message: str) -> None:
        """This attempt ends and torchrun restarts the workers (train/failures.py)."""
        log.warning(message)


class SystemStats:
    """CPU percent and RSS of this process (psutil) and, on a CUDA device, the GPU figures of
    ``GpuStats`` (NVML where available, torch's memory counters always). Never raises for a
    missing or partial NVML: what is unavailable is left out and ``warn`` is told once."""

    def __init__(self, device: torch.device, *, nvml: Any = None,
                 warn: Callable[[str], None] = log.warning):
        import psutil

        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # primes the counter; the first real reading is the next one
        self.gpu = GpuStats(device, nvml=nvml, warn=warn) if device.type == "cuda" else None

    def describe(self) -> dict[str, Any]:
        """Which GPU this process samples (gpu_name, gpu_uuid, gpu_stats_source); {} off CUDA."""
        return self.gpu.describe() if self.gpu is not None else {}

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_percent": self.proc.cpu_percent(None),
                               "rss_bytes": self.proc.memory_info().rss}
        if self.gpu is not None:
            out.update(self.gpu.sample())
        return out

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()


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
