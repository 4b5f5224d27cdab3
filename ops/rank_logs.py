"""Every training worker's output, kept in the artifact store after each launch, failed ones too.

Files go to ``runs/<run id>/<asset>/logs/<name>``, named as resources/launch/rank_logs.py says
(``launch_<k>/attempt_<n>/rank_<r>.stderr.log`` locally, ``launch_<k>/<pod>/<container>.log`` on
Kubernetes). The run links them through a log line and the output's metadata; the model version's
lineage through the checkpoint value's ``logs_uri`` (core/lineage.py).
"""

from dataclasses import dataclass

import dagster as dg

from resources.artifacts.base import ArtifactError, ArtifactStore
from resources.launch.base import TrainingJob, TrainingLauncher
from resources.launch.rank_logs import log_files


def rank_logs_prefix(run_id: str, producer: str, folder: str | None = None) -> str:
    """The artifact key folder of one step's worker logs; ``folder``: one training's of several in
    the step (a sweep trial's, ``trial-003``), whose launches are numbered from 0 as every other's."""
    return f"runs/{run_id}/{producer}/logs" + (f"/{folder}" if folder else "")


@dataclass(frozen=True)
class KeptLogs:
    """Where a step's worker logs were kept: ``uri`` is their folder (None when there were none),
    ``files`` each one's URI by name."""

    uri: str | None
    files: dict[str, str]

    def metadata(self) -> dict[str, dg.MetadataValue]:
        """Output metadata linking the folder and each file; empty when nothing was kept."""
        if self.uri is None:
            return {}
        rows = "\n".join(f"| [{name}]({uri}) |" for name, uri in self.files.items())
        return {"rank_logs": dg.MetadataValue.url(self.uri),
                "rank_log_files": dg.MetadataValue.md(f"| worker log |\n| --- |\n{rows}")}


def keep_rank_logs(
    context: dg.AssetExecutionContext | dg.OpExecutionContext, artifacts: ArtifactStore,
    launcher: TrainingLauncher, job: TrainingJob, *, folder: str | None = None,
) -> KeptLogs:
    """Upload every file under ``launcher.log_dir(job)`` (all launches of the job so far: a retry
    also re-sends what a killed predecessor could not) and name where in the run's log.

    Meant for a ``finally`` after ``launcher.launch``: an upload that fails is a warning, never an
    exception that would hide the training's own error."""
    files = log_files(launcher.log_dir(job))
    prefix = rank_logs_prefix(context.run_id, _producer(context), folder)
    kept: dict[str, str] = {}
    failed: list[str] = []
    for name, path in files.items():
        try:
            kept[name] = artifacts.put_file(path, f"{prefix}/{name}")
        except (ArtifactError, OSError) as exc:
            failed.append(f"{name}: {exc}")
    if failed:
        context.log.warning(f"{len(failed)} of {len(files)} worker log file(s) of {job.name} were not kept:\n"
                            + "\n".join(failed))
    if not kept:
        context.log.warning(f"no worker log files of {job.name} were kept (launcher log folder: "
                            f"{launcher.log_dir(job)})")
        return KeptLogs(uri=None, files={})
    uri = artifacts.uri(prefix)
    context.log.info(f"kept {len(kept)} worker log file(s) of {job.name} at {uri}: {', '.join(kept)}")
    return KeptLogs(uri=uri, files=kept)


def _producer(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> str:
    """The asset the step materializes (its op's name when it is not one asset's)."""
    keys = context.assets_def.keys if context.has_assets_def else set()
    return next(iter(keys)).to_user_string() if len(keys) == 1 else context.op_def.name
