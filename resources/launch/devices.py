"""Which of this machine's GPUs a local training run may use.

Dagster's GPU pool (resources/gpu_pool.py) counts anonymous units: it lets two 1-GPU trainings run
at once on a 2-GPU host but cannot say which GPU each gets, and every torchrun worker would take
cuda:0. So each device also has a lock file under the launcher's work root. A run locks
(fcntl.flock) as many devices as its gpus_per_node, all or nothing, holds them while its workers
run and hands them to the workers as CUDA_VISIBLE_DEVICES. The kernel drops a flock when the
holding process dies, so even a killed step cannot leak a device.
"""

from __future__ import annotations

import fcntl
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Sequence


class DeviceUnavailable(RuntimeError):
    """The run's GPUs did not come free in time, or the machine has fewer than it needs."""


def cuda_device_count() -> int:
    """GPUs the CUDA driver shows this process (0 without a driver or with CPU-only torch).

    Asks without creating a CUDA context, so the orchestrator process stays light."""
    import torch  # deferred: only GPU runs ask, and definitions load without torch

    return torch.cuda.device_count()


def host_devices(device_count: int, environ: Mapping[str, str]) -> list[str]:
    """The device identifiers a run may be handed.

    When this process is itself confined by CUDA_VISIBLE_DEVICES ("2,3", or GPU UUIDs), its
    entries are handed on as they are: CUDA numbers the visible devices from 0, so a child given
    "0" would otherwise get the host's GPU 0, outside the confinement."""
    inherited = environ.get("CUDA_VISIBLE_DEVICES")
    if inherited is not None:
        return [d.strip() for d in inherited.split(",") if d.strip()][:device_count]
    return [str(i) for i in range(device_count)]


def _lock_path(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"


def _try_lock(path: Path, owner: str) -> IO[str] | None:
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    # Who holds it, for the message of a run that waits in vain.
    handle.seek(0)
    handle.truncate()
    handle.write(owner)
    handle.flush()
    return handle


def _release(handles: Sequence[IO[str]]) -> None:
    for handle in handles:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


def _holders(lock_dir: Path, devices: Sequence[str]) -> str:
    found = []
    for device in devices:
        path = _lock_path(lock_dir, device)
        if not path.exists():
            continue  # never locked
        probe = _try_lock(path, "")
        if probe is not None:  # free now
            _release([probe])
            continue
        found.append(f"GPU {device} by {path.read_text(encoding='utf-8').strip() or 'an unnamed run'}")
    return "; ".join(found) or "none (they came free just now)"


@contextmanager
def reserve_devices(
    lock_dir: Path, count: int, devices: Sequence[str], *, owner: str, wait_s: float = 600.0,
    poll_interval_s: float = 1.0, log: Callable[[str], None] | None = None,
) -> Iterator[tuple[str, ...]]:
    """Hold ``count`` of ``devices`` while the block runs; yields their identifiers.

    All or nothing: a run that finds too few free releases what it took and tries again until
    ``wait_s`` has passed, so two runs that each hold half of what the other needs cannot block
    each other. ``count`` 0 holds nothing and yields ()."""
    if count < 0:
        raise ValueError(f"cannot reserve {count} GPUs; gpus_per_node must be 0 (CPU) or more")
    if count == 0:
        yield ()
        return
    if count > len(devices):
        raise DeviceUnavailable(
            f"the job needs {count} GPU(s) per node but this machine shows {len(devices)}"
            + (f" ({', '.join(devices)})" if devices else "")
            + "; lower the recipe's gpus_per_node, or train on the Kubernetes profile"
        )
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        held: list[IO[str]] = []
        taken: list[str] = []
        for device in devices:
            handle = _try_lock(_lock_path(lock_dir, device), owner)
            if handle is not None:
                held.append(handle)
                taken.append(device)
                if len(taken) == count:
                    break
        if len(taken) == count:
            break
        _release(held)
        if time.monotonic() >= deadline:
            raise DeviceUnavailable(
                f"{owner} waited {wait_s:.0f}s for {count} free GPU(s) of {len(devices)}; held: "
                f"{_holders(lock_dir, devices)}. The Dagster GPU pool's limit should not exceed "
                "this machine's GPU count (`dagster instance concurrency set gpu <GPUs>`)"
            )
        if log is not None and not announced:
            log(f"{owner} waits for {count} free GPU(s) of {len(devices)}")
            announced = True
        time.sleep(poll_interval_s)
    try:
        yield tuple(taken)
    finally:
        _release(held)


def visible_devices_env(devices: Sequence[str]) -> dict[str, str]:
    """The workers' CUDA_VISIBLE_DEVICES: exactly the reserved devices; "" (none) for a CPU run,
    so gloo workers never initialise, or occupy memory on, a GPU another run was given."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)}

