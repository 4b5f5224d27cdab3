"""The embedded default launcher: ``torchrun`` worker processes on this machine, under Pipes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import dagster as dg

from resources.launch.base import TrainingJob, TrainingLauncher


def torchrun_command(job: TrainingJob, config_path: Path, python: str = sys.executable) -> list[str]:
    """The torchrun command line for one node, under the supervisor (see supervise.py);
    --standalone picks a free rendezvous port."""
    if job.nnodes != 1:
        raise ValueError(
            f"the local launcher runs one node, but the job asks for nnodes={job.nnodes}; "
            "use the Kubernetes profile for several nodes or set the recipe's nnodes to 1"
        )
    lock = Path(job.config["checkpoint"]["dir"]).parent / ".training.lock"
    return [
        python, "-m", "resources.launch.supervise", "--lock", str(lock), "--",
        python, "-m", "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={job.nproc_per_node}",
        f"--max-restarts={job.max_restarts}",
        "-m", "training_runtime",
        "--config", str(config_path),
    ]


class LocalTorchrunLauncher(TrainingLauncher):
    def __init__(self, work_root: Path, python: str = sys.executable, extra_env: dict[str, str] | None = None):
        self.work_root = Path(work_root)
        self.python = python
        self.extra_env = dict(extra_env or {})

    def launch(self, context, job: TrainingJob) -> dg.PipesClientCompletedInvocation:
        job_dir = self.work_root / job.name
        job_dir.mkdir(parents=True, exist_ok=True)
        config_path = job_dir / "config.json"
        config_path.write_text(json.dumps(job.config, indent=2, sort_keys=True))
        Path(job.config["checkpoint"]["dir"]).parent.mkdir(parents=True, exist_ok=True)
        env = {
            # Workers must import training_runtime from this checkout and keep BLAS to their share
            # of the cores: N ranks x all cores each would thrash a small machine.
            "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[2]),
                                                      os.environ.get("PYTHONPATH", "")] if p),
            "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, job.nproc_per_node))),
            **self.extra_env,
            **job.env,
        }
        client = dg.PipesSubprocessClient(env=env, cwd=str(job_dir))
        return client.run(context=context, command=torchrun_command(job, config_path, self.python))
