"""Concurrent local trainings on one GPU host get disjoint GPUs (CUDA_VISIBLE_DEVICES), held by
per-device lock files for the run's lifetime, all or nothing, and released even on failure. The
machine's GPU count is injected: no GPU is needed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from resources.launch import local as local_launch
from resources.launch.base import GpuRequest, TrainingJob
from resources.launch.devices import DeviceUnavailable, host_devices, reserve_devices
from resources.launch.local import DEVICE_LOCK_DIR, LocalTorchrunLauncher, worker_env

FOUR = ["0", "1", "2", "3"]


def test_two_concurrent_runs_get_disjoint_devices(tmp_path):
    with reserve_devices(tmp_path, 2, FOUR, owner="run-a") as a:
        with reserve_devices(tmp_path, 2, FOUR, owner="run-b") as b:
            assert len(a) == len(b) == 2 and not set(a) & set(b)
            assert set(a) | set(b) == set(FOUR)


def test_a_run_that_finds_too_few_waits_then_fails_naming_the_holders_and_holds_nothing(tmp_path):
    with reserve_devices(tmp_path, 3, FOUR, owner="big-run") as held:
        start = time.monotonic()
        with pytest.raises(DeviceUnavailable, match=r"second-run waited 0s for 2 free GPU\(s\) of 4; held: "
                                                    r"GPU 0 by big-run; GPU 1 by big-run; GPU 2 by big-run"):
            with reserve_devices(tmp_path, 2, FOUR, owner="second-run", wait_s=0.3, poll_interval_s=0.05):
                pass
        assert time.monotonic() - start >= 0.3
        assert held == ("0", "1", "2")
        # All or nothing: the failed run did not keep the one free device it found.
        with reserve_devices(tmp_path, 1, FOUR, owner="small-run", wait_s=0) as small:
            assert small == ("3",)


def test_a_waiting_run_starts_once_the_devices_come_free(tmp_path):
    got: list[tuple[str, ...]] = []
    messages: list[str] = []
    first = reserve_devices(tmp_path, 2, FOUR[:2], owner="first")
    first.__enter__()

    def second():
        with reserve_devices(tmp_path, 1, FOUR[:2], owner="second", wait_s=10, poll_interval_s=0.05,
                             log=messages.append) as devices:
            got.append(devices)

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.3)
    assert not got and messages == ["second waits for 1 free GPU(s) of 2"]
    first.__exit__(None, None, None)
    thread.join(timeout=10)
    assert got == [("0",)]


def test_failure_inside_the_run_releases_its_devices(tmp_path):
    with pytest.raises(RuntimeError, match="worker crashed"):
        with reserve_devices(tmp_path, 2, FOUR[:2], owner="crashing"):
            raise RuntimeError("worker crashed")
    with reserve_devices(tmp_path, 2, FOUR[:2], owner="next", wait_s=0) as devices:
        assert devices == ("0", "1")


def test_a_killed_holder_process_frees_its_device(tmp_path):
    """The kernel drops a flock with its process: a killed step pod or SIGKILLed step leaks nothing."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from resources.launch.devices import reserve_devices\n"
         f"with reserve_devices(Path({str(tmp_path)!r}), 1, ['0', '1'], owner='other-process'):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "held"
        with reserve_devices(tmp_path, 1, ["0", "1"], owner="this-process", wait_s=0) as mine:
            assert mine == ("1",)
        with pytest.raises(DeviceUnavailable, match="GPU 0 by other-process"):
            with reserve_devices(tmp_path, 2, ["0", "1"], owner="this-process", wait_s=0):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=10)
    with reserve_devices(tmp_path, 2, ["0", "1"], owner="this-process", wait_s=0) as both:
        assert both == ("0", "1")


def test_more_gpus_than_the_machine_has_fails_at_once(tmp_path):
    with pytest.raises(DeviceUnavailable, match=r"needs 4 GPU\(s\) per node but this machine shows 2 \(0, 1\); "
                                                r"lower the recipe's gpus_per_node"):
        with reserve_devices(tmp_path, 4, ["0", "1"], owner="huge"):
            pass


def test_cpu_runs_hold_nothing(tmp_path):
    with reserve_devices(tmp_path, 0, [], owner="cpu") as devices:
        assert devices == ()
    assert not tmp_path.joinpath("gpu-0.lock").exists()


def test_an_inherited_confinement_is_handed_on_not_renumbered():
    assert host_devices(4, {}) == ["0", "1", "2", "3"]
    # This process sees two GPUs, the host's 2 and 3: children must get "2"/"3", not "0"/"1".
    assert host_devices(2, {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert host_devices(1, {"CUDA_VISIBLE_DEVICES": "GPU-8d3f,GPU-11aa"}) == ["GPU-8d3f"]
    assert host_devices(0, {"CUDA_VISIBLE_DEVICES": ""}) == []


def _job(name: str, gpus: int, tmp_path: Path, env: dict | None = None) -> TrainingJob:
    return TrainingJob(name=name, config={"checkpoint": {"dir": str(tmp_path / name / "ckpt")}},
                       nproc_per_node=max(1, gpus), gpu=GpuRequest(gpus_per_node=gpus), env=env or {})


def test_worker_env_names_exactly_the_reserved_devices(tmp_path):
    assert worker_env(_job("a", 2, tmp_path), ("1", "3"), environ={}, cpu_count=8)["CUDA_VISIBLE_DEVICES"] == "1,3"
    cpu = worker_env(_job("b", 0, tmp_path), (), environ={}, cpu_count=8)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["OMP_NUM_THREADS"] == "8"
    # Neither the launcher's extra env nor the job's env can point the workers elsewhere.
    overridden = worker_env(_job("c", 1, tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}), ("2",), environ={},
                            extra_env={"CUDA_VISIBLE_DEVICES": "0,1"}, cpu_count=8)
    assert overridden["CUDA_VISIBLE_DEVICES"] == "2"


class _Context:
    class log:
        lines: list[str] = []

        @classmethod
        def info(cls, message: str) -> None:
            cls.lines.append(message)


class _RecordingClient:
    """Stands in for dagster's PipesSubprocessClient: records what each launch would run with."""

    runs: list[dict] = []

    def __init__(self, env, cwd, message_reader=None):
        self.env = env

    def run(self, *, context, command):
        lock_dir = Path(command[command.index("--config") + 1]).parents[1] / DEVICE_LOCK_DIR
        devices = self.env["CUDA_VISIBLE_DEVICES"].split(",") if self.env["CUDA_VISIBLE_DEVICES"] else []
        # While the workers run, their devices are locked against every other launch.
        busy = []
        for device in devices:
            with pytest.raises(DeviceUnavailable):
                with reserve_devices(lock_dir, 1, [device], owner="probe", wait_s=0):
                    pass
            busy.append(device)
        self.runs.append({"devices": busy, "command": command})
        if "fail" in command[-1]:
            raise RuntimeError("torchrun exited 1")
        return "completed"


@pytest.fixture
def recording(monkeypatch):
    _RecordingClient.runs = []
    monkeypatch.setattr(local_launch.dg, "PipesSubprocessClient", _RecordingClient)
    return _RecordingClient.runs


def test_the_local_launcher_gives_each_run_its_own_gpus_and_releases_them(tmp_path, recording):
    launcher = LocalTorchrunLauncher(tmp_path / "launches", device_count=2, device_wait_s=0)
    # Two concurrent runs: the second launches while the first still holds its device.
    with reserve_devices(tmp_path / "launches" / DEVICE_LOCK_DIR, 1, ["0", "1"], owner="first") as first:
        assert launcher.launch(_Context, _job("second", 1, tmp_path)) == "completed"
    assert first == ("0",) and recording[-1]["devices"] == ["1"]
    assert any("second trains on GPU(s) 1" in line for line in _Context.log.lines)
    # A failing run releases its devices too: the next one gets both.
    with pytest.raises(RuntimeError, match="torchrun exited 1"):
        launcher.launch(_Context, _job("fail", 2, tmp_path))
    assert recording[-1]["devices"] == ["0", "1"]
    assert launcher.launch(_Context, _job("after", 2, tmp_path)) == "completed"
    assert recording[-1]["devices"] == ["0", "1"]


def test_the_local_launcher_keeps_cpu_runs_off_the_gpus_without_asking_cuda(tmp_path, recording, monkeypatch):
    def no_cuda():
        raise AssertionError("a CPU run must not count GPUs")

    monkeypatch.setattr(local_launch, "cuda_device_count", no_cuda)
    launcher = LocalTorchrunLauncher(tmp_path / "launches")
    assert launcher.launch(_Context, _job("cpu", 0, tmp_path)) == "completed"
    assert recording[-1]["devices"] == []
