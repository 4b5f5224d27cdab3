"""Every rank's output is kept: torchrun's per-rank files under the launcher's log folder, named
``launch_<k>/attempt_<n>/rank_<r>.<file>`` and uploaded to ``runs/<run id>/<asset>/logs/``, also
when training fails; the model version's lineage links the folder."""

from pathlib import Path

import dagster as dg
import pytest

from core.lineage import build_lineage_record, lineage_rows
from ops.rank_logs import KeptLogs, keep_rank_logs, rank_logs_prefix
from resources.artifacts.base import ArtifactError
from resources.artifacts.local import LocalArtifactStore
from resources.launch.base import TrainingJob, TrainingLauncher
from resources.launch.local import LocalTorchrunLauncher, torchrun_command
from resources.launch.rank_logs import artifact_name, log_files, new_launch_dir
from tests.runtime.helpers import make_config, make_dataset

RDZV = "3f1c2d9e-8a7b-4c6d-9e0f-123456789abc_x1y2z3"  # torchrun's run folder: <rdzv id>_<random>


# --- the layout --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("relative", "name"), [
    (f"launch_0/{RDZV}/attempt_0/1/stderr.log", "launch_0/attempt_0/rank_1.stderr.log"),
    (f"launch_2/{RDZV}/attempt_3/0/stdout.log", "launch_2/attempt_3/rank_0.stdout.log"),
    (f"launch_0/{RDZV}/attempt_1/7/error.json", "launch_0/attempt_1/rank_7.error.json"),
    # Kubernetes pod logs and files torchrun makes only on request keep their relative path.
    ("launch_1/digits-1a2b-0-x7k2p/trainer.log", "launch_1/digits-1a2b-0-x7k2p/trainer.log"),
    (f"launch_0/{RDZV}/attempt_0/filtered_stdout.log", f"launch_0/{RDZV}/attempt_0/filtered_stdout.log"),
])
def test_artifact_names_drop_torchruns_random_folder(relative, name):
    assert artifact_name(relative) == name


def test_launch_folders_count_up_and_keep_earlier_ones(tmp_path):
    root = tmp_path / "logs"
    assert [new_launch_dir(root).name for _ in range(3)] == ["launch_0", "launch_1", "launch_2"]
    (root / "launch_9").mkdir()  # numbers follow the highest, never reuse one
    (root / "notes").mkdir()
    assert new_launch_dir(root).name == "launch_10"


def test_log_files_are_named_and_two_rendezvous_folders_never_overwrite_each_other(tmp_path):
    for rdzv, text in ((RDZV, "first"), ("other_run", "second")):
        path = tmp_path / "launch_0" / rdzv / "attempt_0" / "1" / "stderr.log"
        path.parent.mkdir(parents=True)
        path.write_text(text)
    files = log_files(tmp_path)
    assert sorted(files) == ["launch_0/attempt_0/rank_1.stderr.log", "launch_0/other_run/attempt_0/1/stderr.log"]
    assert {p.read_text() for p in files.values()} == {"first", "second"}
    assert log_files(tmp_path / "missing") == {} and log_files(None) == {}


def test_torchrun_keeps_every_ranks_streams_only_when_given_a_folder(tmp_path):
    job = TrainingJob(name="digits", config={"checkpoint": {"dir": str(tmp_path / "ckpt")}}, nproc_per_node=2)
    plain = torchrun_command(job, tmp_path / "config.json")
    kept = torchrun_command(job, tmp_path / "config.json", log_dir=tmp_path / "logs" / "launch_0")
    assert not any(a.startswith(("--log-dir", "--tee", "--redirects")) for a in plain)
    # torchrun's options, before the module it runs; tee keeps the lines on the console too.
    assert kept[kept.index("-m", kept.index("torch.distributed.run")) - 2:][:2] == [
        f"--log-dir={tmp_path / 'logs' / 'launch_0'}", "--tee=3"]
    assert kept[-4:] == plain[-4:] == ["-m", "training_runtime", "--config", str(tmp_path / "config.json")]


# --- upload ------------------------------------------------------------------------------------------
class _FolderLauncher(TrainingLauncher):
    """A launcher whose workers already wrote their files (the upload does not care how)."""

    def __init__(self, root: Path | None):
        self.root = root

    def launch(self, context, job):
        raise AssertionError("not launched in these tests")

    def log_dir(self, job):
        return self.root


def run_log(result: dg.ExecuteInProcessResult, instance: dg.DagsterInstance) -> list[str]:
    """The messages of the run's log (``context.log`` lines are not among the result's events)."""
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def _upload(launcher: TrainingLauncher, artifacts) -> tuple[dg.ExecuteInProcessResult, list[str], list[KeptLogs]]:
    job = TrainingJob(name="digits-abc", config={}, nproc_per_node=2)
    kept: list[KeptLogs] = []

    @dg.asset
    def digits_checkpoint(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        kept.append(keep_rank_logs(context, artifacts, launcher, job))
        return dg.MaterializeResult(metadata=kept[-1].metadata())

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([digits_checkpoint], instance=instance)
        return result, run_log(result, instance), kept


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_kept_logs_are_uploaded_under_the_run_and_linked_from_its_metadata(tmp_path):
    logs = tmp_path / "job" / "logs"
    _write(logs, f"launch_0/{RDZV}/attempt_0/0/stderr.log", "rank 0 says hi\n")
    _write(logs, f"launch_0/{RDZV}/attempt_0/1/stderr.log", "rank 1 says hi\n")
    store = LocalArtifactStore(tmp_path / "artifacts")
    result, messages, (kept,) = _upload(_FolderLauncher(logs), store)
    prefix = rank_logs_prefix(result.run_id, "digits_checkpoint")
    assert prefix == f"runs/{result.run_id}/digits_checkpoint/logs"
    assert store.list_keys("runs/") == [f"{prefix}/launch_0/attempt_0/rank_0.stderr.log",
                                        f"{prefix}/launch_0/attempt_0/rank_1.stderr.log"]
    assert (store.root / prefix / "launch_0/attempt_0/rank_1.stderr.log").read_text() == "rank 1 says hi\n"
    assert kept.uri == store.uri(prefix)
    metadata = result.asset_materializations_for_node("digits_checkpoint")[0].metadata
    assert metadata["rank_logs"].value == store.uri(prefix)
    table = metadata["rank_log_files"].value
    assert f"[launch_0/attempt_0/rank_1.stderr.log]({store.uri(prefix + '/launch_0/attempt_0/rank_1.stderr.log')})" in table
    assert any(f"kept 2 worker log file(s) of digits-abc at {store.uri(prefix)}" in m for m in messages)


def test_a_launcher_that_kept_nothing_adds_no_metadata_and_says_so(tmp_path):
    _, messages, (kept,) = _upload(_FolderLauncher(None), LocalArtifactStore(tmp_path / "artifacts"))
    assert kept == KeptLogs(uri=None, files={}) and kept.metadata() == {}
    assert any("no worker log files of digits-abc were kept" in m for m in messages)


def test_a_failed_upload_is_a_warning_and_the_other_files_still_go_up(tmp_path):
    logs = tmp_path / "logs"
    _write(logs, f"launch_0/{RDZV}/attempt_0/0/stdout.log", "ok\n")
    _write(logs, f"launch_0/{RDZV}/attempt_0/1/stdout.log", "ok\n")

    class HalfBrokenStore(LocalArtifactStore):
        def put_file(self, local_path, key):
            if key.endswith("rank_1.stdout.log"):
                raise ArtifactError("the bucket refused it")
            return super().put_file(local_path, key)

    store = HalfBrokenStore(tmp_path / "artifacts")
    result, messages, (kept,) = _upload(_FolderLauncher(logs), store)
    assert list(kept.files) == ["launch_0/attempt_0/rank_0.stdout.log"]
    warnings = [m for m in messages if "were not kept" in m]
    assert warnings and "rank_1.stdout.log: the bucket refused it" in warnings[0]
    assert store.list_keys("runs/") == [f"runs/{result.run_id}/digits_checkpoint/logs/launch_0/attempt_0/rank_0.stdout.log"]


# --- a real two-rank torchrun that fails ----------------------------------------------------------------
@pytest.mark.slow
def test_every_rank_and_attempt_of_a_failing_local_training_is_kept(tmp_path):
    manifest, locations = make_dataset(tmp_path / "data", n_train=64, n_test=32, per_shard=16)
    config = make_config(tmp_path, manifest, locations, name="digits", epochs=1)
    config["train_fn"] = "tests.ops.rank_log_workers:introduce_then_fail"
    job = TrainingJob(name="digits-logs", config=config, nproc_per_node=2, max_restarts=1,
                      env={"OMP_NUM_THREADS": "1"})
    launcher = LocalTorchrunLauncher(tmp_path / "launches")
    store = LocalArtifactStore(tmp_path / "artifacts")
    kept: list[KeptLogs] = []

    @dg.asset
    def digits_checkpoint(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        # What the training op does around its launch.
        try:
            launcher.launch(context, job)
        finally:
            kept.append(keep_rank_logs(context, store, launcher, job))
        return dg.MaterializeResult(metadata=kept[-1].metadata())

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([digits_checkpoint], instance=instance, raise_on_error=False)
        messages = run_log(result, instance)
    assert not result.success  # training failed, and the logs were kept all the same
    (logs,) = kept
    prefix = rank_logs_prefix(result.run_id, "digits_checkpoint")
    assert logs.uri == store.uri(prefix)
    names = set(logs.files)
    # Both ranks, both attempts (the restart did not overwrite the first), both streams.
    for attempt in (0, 1):
        for rank in (0, 1):
            for stream in ("stdout", "stderr"):
                assert f"launch_0/attempt_{attempt}/rank_{rank}.{stream}.log" in names, sorted(names)

    def text(name: str) -> str:
        return (store.root / prefix / name).read_text()

    rank1 = text("launch_0/attempt_0/rank_1.stderr.log")
    assert "stderr line of rank 1, attempt 0" in rank1 and "rank 1 fails on purpose in attempt 0" in rank1
    assert "rank 0" not in rank1  # each rank's file holds only its own output
    assert text("launch_0/attempt_0/rank_1.stdout.log") == "stdout line of rank 1, attempt 0\n"
    assert text("launch_0/attempt_0/rank_0.stdout.log") == "stdout line of rank 0, attempt 0\n"
    assert "rank 0 fails on purpose in attempt 0" in text("launch_0/attempt_0/rank_0.stderr.log")
    # The second attempt's refusal to start over (no checkpoint) is kept per rank too.
    assert "saved no checkpoint" in text("launch_0/attempt_1/rank_1.stderr.log")
    assert "rank 1 fails on purpose" in text("launch_0/attempt_0/rank_1.error.json")
    # The run's log names where they are, although the step failed.
    assert any(f"at {logs.uri}" in m for m in messages)


def test_the_lineage_links_the_training_logs_when_the_checkpoint_names_them():
    def record(**logs: str) -> dict:
        checkpoint = {"weights_uri": "s3://b/w", "weights_sha256": "0" * 64, "weights_path": "models/d/w",
                      "commit_id": "c", **logs}
        return build_lineage_record(
            model="digits", version=1, checkpoint=checkpoint, raw={"commit_id": "r"},
            shards={"dataset": "digits", "commit_id": "s", "manifest_path": "m.json"}, store_facts={},
            resolved_config={"world_size": 2, "backend": "gloo"}, metrics={}, evaluation={"test": {}},
            gate={"passed": True}, run_id="r1", run_url="http://dagster/runs/r1")

    uri = "s3://b/runs/r1/digits_checkpoint/logs"
    linked = record(logs_uri=uri)
    assert linked["training"]["logs"] == uri
    rows = {row.field: row for row in lineage_rows(linked)}
    assert rows["training logs"].value == rows["training logs"].url == uri
    # Checkpoints from before logs were kept: no row, and nothing else changes.
    assert "training logs" not in {row.field for row in lineage_rows(record())}
