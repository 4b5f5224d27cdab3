"""``python -m pipelines tensorboard``: a model's versions collected from the artifact store into
one log directory, a run per version, read back with TensorBoard's own loader."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipelines.cli import main
from pipelines.cli.tensorboard import prepare_logdir
from tests.cli.tensorboard_versions import register_versions, write_run_events

V1_LOSSES = [2.0, 1.5, 1.0]
V2_LOSSES = [1.75, 0.75, 0.5, 0.25]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


@pytest.fixture
def home(tmp_path):
    """DAGSTER_HOME of a platform where ``toy`` has v1 and v2 with event files and v3 without."""
    home = tmp_path / "home"
    register_versions(home, "toy", {1: write_run_events(tmp_path / "run1", V1_LOSSES),
                                    2: write_run_events(tmp_path / "run2", V2_LOSSES), 3: None})
    return home


@pytest.fixture
def cli(home, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("PLATFORM_PROFILE", "local")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_every_version_becomes_one_run_of_the_log_directory(cli, home, tmp_path):
    logdir = tmp_path / "logs"
    code, out, err = cli("tensorboard", "toy", "--no-serve", "--logdir", str(logdir))
    assert code == 0, err
    assert sorted(p.name for p in logdir.iterdir()) == ["v1", "v2"]
    assert losses(logdir / "v1") == [(2, 2.0), (4, 1.5), (6, 1.0)]
    assert losses(logdir / "v2") == [(2, 1.75), (4, 0.75), (6, 0.5), (8, 0.25)]
    lines = out.splitlines()
    assert lines[0] == f"toy v1: 1 event file(s) -> {logdir / 'v1'}"
    assert lines[1] == f"toy v2: 1 event file(s) -> {logdir / 'v2'}"
    assert lines[2].startswith("no event files for v3 (")
    assert lines[-1] == f"log directory ready: {logdir}"


def test_the_default_log_directory_is_under_the_platform_data_root(cli, home):
    code, out, err = cli("tensorboard", "toy", "--logdir-only", "--versions", "2")
    assert code == 0, err
    logdir = home / "platform" / "tensorboard" / "toy"
    assert sorted(p.name for p in logdir.iterdir()) == ["v2"]
    assert losses(logdir / "v2")[-1] == (8, 0.25)


def test_a_second_call_replaces_each_version_folder_with_the_stores_files(home, tmp_path):
    from pipelines.profiles import Profile

    profile = Profile(name="local", data_root=home / "platform")
    store, artifacts = profile.store(), profile.resources()["artifacts"].get()
    logdir = tmp_path / "logs"
    (logdir / "v1").mkdir(parents=True)
    (logdir / "v1" / "events.out.tfevents.0.stale").write_bytes(b"")
    (logdir / "mine").mkdir()  # not a version folder: left alone
    prepared = prepare_logdir(store, artifacts, "toy", logdir, [1])
    assert prepared.copied == {1: 1} and prepared.without_events == []
    assert not (logdir / "v1" / "events.out.tfevents.0.stale").exists() and (logdir / "mine").is_dir()
    assert len(list((logdir / "v1").iterdir())) == 1 and losses(logdir / "v1") == [(2, 2.0), (4, 1.5), (6, 1.0)]


def test_versions_without_event_files_alone_are_a_clear_error(cli):
    code, out, err = cli("tensorboard", "toy", "--no-serve", "--versions", "3")
    assert code == 2 and out == ""
    assert err.startswith("error: no version of 'toy' among v3 has TensorBoard event files")
    assert "telemetry.tensorboard" in err


def test_an_unknown_model_or_version_is_a_one_line_error(cli):
    code, _, err = cli("tensorboard", "toy", "--no-serve", "--versions", "9")
    assert code == 2 and err.strip() == "error: model 'toy' has no version 9; registered versions: 1, 2, 3"
    code, _, err = cli("tensorboard", "nope", "--no-serve")
    assert code == 2 and err.startswith("error: no pipeline named 'nope' in code location(s) platform, vision")



@pytest.mark.slow
def test_the_demos_real_versions_each_bring_their_training_curve(tmp_path_factory, tmp_path):
    """Two real Dagster runs: the training op copied each run's event files beside its weights,
    the lineage names them, and the command lays them out as v1 and v2."""
    from core.registry import read_lineage
    from tests.cli.demo_platform import shared_demo_platform

    demo = shared_demo_platform(tmp_path_factory)
    logdir = tmp_path / "logs"
    result = demo.cli("tensorboard", "digits", "--no-serve", "--logdir", str(logdir))
    assert result.returncode == 0, result.stderr
    store = demo.store()
    for version in (1, 2):
        record = read_lineage(store, "digits", version)
        checkpoint = record["checkpoint"]
        assert checkpoint["tensorboard_path"] == checkpoint["store_path"].rsplit("/", 1)[0] + "/tensorboard/"
        curve = losses(logdir / f"v{version}")
        assert curve[-1][0] == record["training_figures"]["steps"]
        assert curve[-1][1] == pytest.approx(record["training_figures"]["final_loss"], rel=1e-6)
    assert f"tensorboard     {checkpoint['tensorboard_uri']}" in demo.cli("lineage", "digits").stdout
