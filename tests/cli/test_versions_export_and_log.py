"""What the CLI shows, as a user reads it: ``versions`` names a team task's own metric, an exported
image model's README gives the model input's shape, and ``log`` prints a branch's commits, so
"nothing reached main" is read from a command, not from the store's JSON."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from core.lineage import version_folder
from core.registry import lineage_path, version_tag
from core.versions import register_version
from pipelines.cli import main
from pipelines.cli.export import readme
from pipelines.cli.render import headline, headline_metric
from pipelines.profiles import Profile
from resources.store.base import MAIN
from tests.cli.records import make_record


@pytest.fixture
def cli(monkeypatch, capsys):
    """``python -m pipelines ARGS`` against the platform at ``home``, in this process: (status, out, err)."""
    def run(home: Path, *args: str) -> tuple[int, str, str]:
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        monkeypatch.delenv("PLATFORM_PROFILE", raising=False)
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def local_store(home: Path):
    store = Profile(name="local", data_root=home / "platform").store()
    store.ensure_repository()
    return store


def commit_record(store, record: dict) -> str:
    store.put_object(MAIN, lineage_path(record["model"], record["version"]), json.dumps(record).encode())
    commit = store.commit(MAIN, f"Register {record['model']} v{record['version']}", {"dagster_run_id": "feedc0de-1"})
    store.create_tag(version_tag(record["model"], record["version"]), commit.id)
    return commit.id


# --- versions: the task's own metric ----------------------------------------------------------------
DENOISER = {"evaluation.test": {"loss": 0.1913, "reconstruction_mse": 0.1913, "num_samples": 208},
            "task": "training_runtime.examples.denoising:Reconstruction",
            "quality_gate": {"passed": True, "failures": [], "bounds": {"test_reconstruction_mse": {"max": 0.6}}}}


def test_versions_shows_the_metric_a_team_task_is_gated_on_not_its_loss(tmp_path, cli):
    store = local_store(tmp_path)
    commit_record(store, make_record(1, model="digits_denoiser", **DENOISER))
    status, out, err = cli(tmp_path, "versions", "digits_denoiser")
    assert status == 0, err
    header, _, row = out.splitlines()[:3]
    assert "test metric" in header and "test acc" not in header
    assert "reconstruction_mse 0.1913" in row and "loss" not in row


def test_the_headline_metric_falls_back_from_gate_to_monitor_to_the_only_metric_to_loss():
    assert headline(make_record(1)["evaluation"]["test"]) == "0.9500"  # a classifier: accuracy, as before
    assert headline({"loss": 1.2, "perplexity": 8.23012, "accuracy": 0.2}) == "perplexity 8.2301"
    test = {"loss": 0.3, "psnr": 21.0, "ssim": 0.8, "num_samples": 9}
    gated = {"quality_gate": {"bounds": {"validation_psnr": {"min": 1}, "test_ssim": {"min": 0.5}}}}
    assert headline_metric(test, gated) == "ssim"  # the gate's test bound; a validation bound is no test figure
    assert headline_metric(test, {"training_figures": {"monitor": "psnr"}}) == "psnr"
    assert headline_metric(test, {"quality_gate": {"bounds": {"test_loss": {"max": 1}}}}) == "loss"
    assert headline_metric(test, {}) == "loss"  # two candidates, nothing says which: the loss
    assert headline_metric({"loss": 0.3, "iou": 0.7, "num_samples": 9}, {}) == "iou"
    with pytest.raises(ValueError, match="hold no scalar metric"):
        headline_metric({"num_samples": 9}, {})


# --- export: an image model's README ------------------------------------------------------------------
def test_an_exported_image_models_readme_gives_the_input_shape(tmp_path, cli):
    from tests.serving.test_card_alone import image_manifest, model_folder

    folder = model_folder(tmp_path / "model", "cnn", image_manifest("RGB"), {})
    files = {n: (folder / n).read_bytes() for n in ("model.safetensors", "model_card.json", "model.onnx")}
    store = local_store(tmp_path)
    store.create_branch("run-1", MAIN)
    sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
    record = lambda v: {**make_record(v, model="shapes"),  # noqa: E731
                        "checkpoint": {**make_record(v)["checkpoint"], "sha256": sha},
                        "version_folder": version_folder("shapes", v)}
    register_version(store, "run-1", "shapes", record, files, {})
    status, _, err = cli(tmp_path, "export", "shapes", "--version", "1", str(tmp_path / "deploy"))
    assert status == 0, err
    text = (tmp_path / "deploy" / "README.md").read_text()
    assert '`x` is ["batch", 3, 24, 32] float32, made from a raw images input' in text
    assert "null" not in text

    # A card written before an image's model_input named its shape: the model's input shape instead.
    card = json.loads(files["model_card.json"])
    del card["preprocessing"]["model_input"]["shape"]
    old = readme(record(1), {**files, "model_card.json": json.dumps(card).encode()}, "c" * 64)
    assert '`x` is ["batch", 3, 24, 32] float32' in old and "null" not in old


# --- log: what reached main ---------------------------------------------------------------------------
def test_log_prints_mains_commits_with_their_tags_and_not_a_failed_runs(tmp_path, cli):
    store = local_store(tmp_path)
    first = commit_record(store, make_record(1, model="toy"))
    second = commit_record(store, make_record(2, model="toy"))
    # A run whose gate failed: its commit stays on its run branch.
    store.create_branch("run-failed", MAIN)
    store.put_object("run-failed", "models/toy/versions/v3/lineage.json", b"{}")
    failed = store.commit("run-failed", "Train toy", {"dagster_run_id": "0badf00d-2"}).id

    status, out, err = cli(tmp_path, "log")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "main: log, newest first (3 commits)"
    assert lines[1].split() == ["commit", "date", "(UTC)", "message", "tags", "run"]
    assert [line.split()[0] for line in lines[3:]] == [second[:12], first[:12], store.log(MAIN)[-1].id[:12]]
    assert lines[3].split()[2:] == ["Register", "toy", "v2", "toy-v2", "feedc0de"]
    assert lines[5].split()[2:] == ["Repository", "created"]
    assert failed[:12] not in out and "Train toy" not in out

    status, out, _ = cli(tmp_path, "log", "--branch", "run-failed", "-n", "1")
    assert status == 0
    assert out.splitlines()[0] == "run-failed: log, newest first (1 commit; older ones with a larger -n)"
    assert out.splitlines()[3].split()[:5] == [failed[:12], out.splitlines()[3].split()[1], "Train", "toy", "0badf00d"]

    status, out, _ = cli(tmp_path, "log", "--json", "-n", "2")
    data = json.loads(out)
    assert status == 0 and data["more"] is True and data["ref"] == "main"
    assert [c["id"] for c in data["commits"]] == [second, first]
    assert data["commits"][0]["tags"] == ["toy-v2"] and data["commits"][0]["parents"] == [first]
    assert data["commits"][0]["metadata"] == {"dagster_run_id": "feedc0de-1"}


def test_log_first_parent_follows_what_mains_head_has_been(tmp_path, cli):
    store = local_store(tmp_path)
    store.create_branch("run-a", MAIN)
    store.put_object("run-a", "datasets/a.txt", b"a")
    store.commit("run-a", "Ingest raw data of a", {})
    store.merge("run-a", MAIN, "Publish dataset a")
    status, out, _ = cli(tmp_path, "log", "--first-parent")
    messages = [line.split("  ")[2].strip() for line in out.splitlines()[3:]]
    assert status == 0 and messages == ["Publish dataset a (merge)", "Repository created"]
    status, out, _ = cli(tmp_path, "log")
    assert [line.split("  ")[2].strip() for line in out.splitlines()[3:]] == [
        "Publish dataset a (merge)", "Ingest raw data of a", "Repository created"]


def test_log_of_a_branch_that_does_not_exist_or_of_an_empty_store_says_so(tmp_path, cli):
    status, _, err = cli(tmp_path / "empty", "log")
    assert status == 2 and "has no repository yet, so no commits: run a pipeline (make demo) first" in err
    local_store(tmp_path)
    status, _, err = cli(tmp_path, "log", "--branch", "nope")
    assert status == 2 and "'nope' is not a branch, tag or commit of the store" in err and "its branches: main" in err
    status, _, err = cli(tmp_path, "log", "-n", "0")
    assert status == 2 and "-n must be at least 1, got 0" in err


def test_log_has_help_and_is_listed(capsys):
    from pipelines.cli.parser import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["log", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: python -m pipelines log")
    assert all(option in out for option in ("--branch", "-n N", "--first-parent", "--json"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "log" in capsys.readouterr().out
