"""The embedded default launcher: ``torchrun`` worker processes on this machine, under Pipes."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

import dagster as dg

from resources.launch.base import TrainingJob, TrainingLauncher
from resources.launch.gang import GANG_FILE
from resources.launch.devices import cuda_device_count, host_devices, reserve_devices, visible_devices_env
from resources.launch.durable_messages import LiveDurableFileMessageReader, catch_up, messages_file
from resources.launch.rank_logs import LAUNCH_PREFIX, WORKER_LOG_DIR, new_launch_dir
from training_runtime.distributed.allocator import allocator_env
from training_runtime.observe.attempts import LaunchOutcome

# Per-GPU lock files of the local launches, under the launcher's work root (see devices.py).
DEVICE_LOCK_DIR = ".gpu-locks"


def torchrun_command(job: TrainingJob, config_path: Path, python: str = sys.executable, *,
                     log_dir: Path | None = None, devices: Sequence[str] = (),
                     gang_options: Sequence[str] = ()) -> list[str]:
    """The command line of one local launch: a single node's torchrun under the supervisor (see
    supervise.py; --standalone picks a free rendezvous port), or, for several nodes, a gang of
    torchrun agents, one per node (gang.py: elastic between ``job.min_nodes`` and ``job.nnodes``).
    With ``log_dir``, every rank's output is also kept there (see ``rank_log_options``)."""
    lock = Path(job.config["checkpoint"]["dir"]).parent / ".training.lock"
    worker = ["-m", "training_runtime", "--config", str(config_path)]
    if job.nnodes > 1:
        return [
            python, "-m", "resources.launch.gang", "--lock", str(lock), "--nodes", job.nnodes_arg,
            f"--nproc={job.nproc_per_node}", f"--run-id={job.name}", f"--max-restarts={job.max_restarts}",
            f"--python={python}", *([f"--log-dir={log_dir}"] if log_dir is not None else []),
            *([f"--devices={','.join(devices)}"] if devices else []), *gang_options, "--", *worker,
        ]
    return [
        python, "-m", "resources.launch.supervise", "--lock", str(lock), "--",
        python, "-m", "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={job.nproc_per_node}",
        f"--max-restarts={job.max_restarts}",
        *rank_log_options(log_dir),
        *worker,
    ]


def rank_log_options(log_dir: Path | None) -> list[str]:
    """torchrun options that keep each rank's stdout and stderr in files of their own under
    ``log_dir`` (one folder per restart attempt, all kept; layout in rank_logs.py).

    --tee implies --redirects: each worker writes to its files and torchrun copies every line to its
    own console, prefixed "[default<rank>]:", so the run's compute log still shows every rank.
    Dagster Pipes messages travel through PipesSubprocessClient's message file, not the console,
    so the redirection does not touch them."""
    return [] if log_dir is None else [f"--log-dir={log_dir}", "--tee=3"]


# The checkout the workers import training_runtime (and the platform's own code) from.
PLATFORM_ROOT = Path(__file__).resolve().parents[2]


def worker_python_path(python_path: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> str:
    """PYTHONPATH of local workers: the code location's import roots (a team package outside the
    repository), then this checkout, then whatever PYTHONPATH the launching process had; each once."""
    environ = os.environ if environ is None else environ
    entries = [*python_path, str(PLATFORM_ROOT), *environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in entries if p))


def worker_env(job: TrainingJob, devices: Sequence[str], *, extra_env: Mapping[str, str] | None = None,
               environ: Mapping[str, str] | None = None, cpu_count: int | None = None,
               python_path: Sequence[str] = ()) -> dict[str, str]:
    """The environment of one local launch's torchrun workers, given the GPUs reserved for it;
    ``python_path``: the code location's import roots (see ``worker_python_path``)."""
    environ = os.environ if environ is None else environ
    cpus = (os.cpu_count() or 1) if cpu_count is None else cpu_count
    return {
        # Workers import training_runtime from this checkout and the team's code from where its
        # location imports it; and keep BLAS to their share of the cores: N ranks x all cores
        # each would thrash a small machine.
        "PYTHONPATH": worker_python_path(python_path, environ),
        "OMP_NUM_THREADS": str(max(1, cpus // max(1, job.nproc_per_node))),
        # A worker's stdout is a file under --tee, which Python would block-buffer: lines would
        # reach the console (and the file) kilobytes late, or never when the worker is killed.
        "PYTHONUNBUFFERED": "1",
        # FSDP's freed buffers leave RSS only with a fixed mmap threshold (read at process start).
        **allocator_env(job.config, environ),
        **(extra_env or {}),
        **job.env,
        # Last, so nothing above can point two runs at the same GPU.
        **visible_devices_env(devices),
    }


def gang_failure(log_dir: Path, outcome: LaunchOutcome | None) -> LaunchOutcome | None:
    """A local gang's own account of its failure (gang.json, in the launch's newest log folder)
    put before the runtime's: a gang that fell below min_nodes says so by name."""
    launches = sorted(log_dir.glob(f"{LAUNCH_PREFIX}*/{GANG_FILE}"), key=lambda p: int(p.parent.name[len(LAUNCH_PREFIX):]))
    if outcome is None or not launches:
        return outcome
    message = json.loads(launches[-1].read_text()).get("message")
    return dataclasses.replace(outcome, message=f"{message}; {outcome.message}") if message else outcome


class LocalTorchrunLauncher(TrainingLauncher):
    """Runs the job's torchrun on this machine, on GPUs no other local run holds, with the code
    location's ``python_path`` first on the workers' PYTHONPATH.

    ``device_count`` fixes how many GPUs the machine has (tests); None asks CUDA when a job first
    needs GPUs. Device locks live under ``work_root``: launchers sharing a GPU host must share it."""

    def __init__(self, work_root: Path, python: str = sys.executable, extra_env: dict[str, str] | None = None,
                 *, device_count: int | None = None, device_wait_s: float = 600.0, python_path: Sequence[str] = (),
                 rendezvous_join_timeout_s: float = 600.0, node_replacement_s: float = 10.0,
                 node_replacements: int | None = None):
        self.work_root = Path(work_root)
        self.python = python
        self.extra_env = dict(extra_env or {})
        self.python_path = tuple(python_path)  # the code location's import roots (worker_python_path)
        self.device_count = device_count
        self.device_wait_s = device_wait_s
        # A local gang of several nodes (gang.py): how long the nodes wait for each other, and how
        # soon and how often a lost node is started again (None: max_restarts times).
        self.gang_options = [f"--join-timeout-s={rendezvous_join_timeout_s:g}",
                             f"--replace-after-s={node_replacement_s:g}",
                             *([f"--max-replacements={node_replacements}"] if node_replacements is not None else [])]

    def _devices(self, wanted: int) -> list[str]:
        if wanted == 0:
            return []  # CPU runs never touch CUDA, not even to count devices
        count = cuda_device_count() if self.device_count is None else self.device_count
        return host_devices(count, os.environ)

    def log_dir(self, job: TrainingJob) -> Path:
        return self.work_root / job.name / WORKER_LOG_DIR

    def failure_of(self, job: TrainingJob) -> LaunchOutcome | None:
        outcome = super().failure_of(job)
        return gang_failure(self.log_dir(job), outcome) if job.nnodes > 1 else outcome

    def launch(self, context, job: TrainingJob) -> dg.PipesClientCompletedInvocation:
        job_dir = self.work_root / job.name
        job_dir.mkdir(parents=True, exist_ok=True)
        config_path = job_dir / "config.json"
        config_path.write_text(json.dumps(job.config, indent=2, sort_keys=True))
        Path(job.config["checkpoint"]["dir"]).parent.mkdir(parents=True, exist_ok=True)
        wanted = job.gpu.gpus_per_node * job.nnodes  # a local gang's nodes share this machine's GPUs
        with reserve_devices(self.work_root / DEVICE_LOCK_DIR, wanted, self._devices(wanted), owner=job.name,
                             wait_s=self.device_wait_s, log=context.log.info) as devices:
            if devices:
                context.log.info(f"{job.name} trains on GPU(s) {', '.join(devices)} of this machine")
            env = worker_env(job, devices, extra_env=self.extra_env, python_path=self.python_path)
            # Messages an earlier launch's dead run worker never read are reported first; this
            # launch's go to a file beside the checkpoints, so a retry can do the same for it.
            work_dir = Path(job.config["checkpoint"]["dir"]).parent
            catch_up(context, work_dir)
            launch_dir = new_launch_dir(self.log_dir(job))
            reader = LiveDurableFileMessageReader(messages_file(work_dir, launch_dir.name), context=context)
            client = dg.PipesSubprocessClient(env=env, cwd=str(job_dir), message_reader=reader)
            command = torchrun_command(job, config_path, self.python, log_dir=launch_dir,
                                       devices=devices if job.nnodes > 1 else (), gang_options=self.gang_options)
            return client.run(context=context, command=command)
