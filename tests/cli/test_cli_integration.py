"""``python -m pipelines`` as a user runs it, on a temporary DAGSTER_HOME after two real demo runs."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import dagster as dg
import pytest

from core.lineage import lineage_markdown, lineage_rows
from core.registry import read_alias, read_lineage
from tests.cli.demo_platform import DROPPED_ROWS, shared_demo_platform

USER = getpass.getuser()  # the CLI's subprocesses run as this OS user

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return shared_demo_platform(tmp_path_factory)


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def one_line_error(result, code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def row(text: str, *first_cells: str) -> list[str]:
    """The table row whose cells (after the optional '*' mark) start with ``first_cells``."""
    for line in text.splitlines():
        cells = line.split()
        if cells[:len(first_cells)] == list(first_cells) or cells[1:len(first_cells) + 1] == list(first_cells):
            return cells
    raise AssertionError(f"no row starting with {first_cells} in:\n{text}")


def observations(demo, kinds: tuple[str, ...], model: str = "digits") -> list[tuple[str | None, dict]]:
    """(description, plain metadata) of the CLI's observations on ``model/model_version``, oldest first."""
    with dg.DagsterInstance.from_config(str(demo.home)) as instance:
        records = instance.fetch_observations(dg.AssetKey([model, "model_version"]), limit=200, ascending=True).records
    out = []
    for r in records:
        meta = {k: v.value for k, v in r.asset_observation.metadata.items()}
        if meta.get("kind") in kinds:
            out.append((r.asset_observation.description, meta))
    return out


def test_compare_puts_two_versions_side_by_side(demo):
    out = ok(demo.cli("compare", "digits", "1", "v2"))
    assert out.splitlines()[0].startswith("digits: v1 vs v2")
    assert row(out, "train.seed") == ["*", "train.seed", "0", "1"]
    assert row(out, "train.lr") == ["*", "train.lr", "0.0030", "0.0050"]
    assert row(out, "train.epochs") == ["*", "train.epochs", "3", "4"]
    assert row(out, "train.batch_size") == ["train.batch_size", "32", "32"]
    first, second = (read_lineage(demo.store(), "digits", v) for v in (1, 2))
    assert row(out, "shards", "commit") == ["*", "shards", "commit", first["data"]["shards_commit"][:12],
                                            second["data"]["shards_commit"][:12]]
    accuracy = row(out, "test", "accuracy")
    assert accuracy[-2:] == [f"{first['evaluation']['test']['accuracy']:.4f}",
                             f"{second['evaluation']['test']['accuracy']:.4f}"]
    train_1, train_2 = (r["training"]["config"]["data"]["manifest"]["splits"]["train"]["num_samples"]
                        for r in (first, second))
    assert train_1 > train_2  # v2 was trained without the first rows
    assert row(out, "train", "split", "size")[-2:] == [str(train_1), str(train_2)]


def test_diff_shows_data_objects_parameters_and_metrics(demo):
    out = ok(demo.cli("diff", "digits", "1", "2"))
    assert out.splitlines()[0] == "digits: v1 -> v2"
    raw = row(out, "changed", "datasets/digits/raw/data.parquet")
    assert raw[2] != raw[4]  # the raw file shrank: rows were dropped
    assert row(out, "changed", "datasets/digits/shards/manifest.json")
    assert row(out, "train.seed") == ["train.seed", "0", "1"]
    assert "train.batch_size" not in out
    store = demo.store()
    first, second = (read_lineage(store, "digits", v) for v in (1, 2))
    entries = store.diff(first["data"]["shards_commit"], second["data"]["shards_commit"], prefix="datasets/digits/")
    assert len(entries) > 1
    for entry in entries:
        assert row(out, entry.type, entry.path)
    assert row(out, "test", "samples") == ["test", "samples",
                                           str(first["evaluation"]["test"]["num_samples"]),
                                           str(second["evaluation"]["test"]["num_samples"])]
    assert DROPPED_ROWS > 0


def test_comment_reaches_the_store_lineage_and_the_asset_history(demo):
    text = "Good enough for the shadow deployment"
    out = ok(demo.cli("comment", "digits", "1", text, "--author", "alice"))
    # The local store authenticates nobody: the OS user is recorded as such, the typed name as a note.
    assert out.startswith(f'Recorded comment on digits v1 by {USER} (OS user, not authenticated), note "alice"')
    lineage = ok(demo.cli("lineage", "digits", "--version", "1"))
    assert f'{USER} (OS user, not authenticated), note "alice": {text}' in lineage
    as_json = json.loads(ok(demo.cli("lineage", "digits", "--version", "1", "--json")))
    last = as_json["annotations"]["comments"][-1]
    assert (last["author"], last["note"], last["actor"]["authenticated"], last["text"]) == (USER, "alice", False, text)
    assert as_json["version"] == 1 and as_json["checkpoint"]["sha256"]
    observed = [(d, m) for d, m in observations(demo, ("comment",)) if m["comment"] == text]
    assert len(observed) == 1
    description, meta = observed[0]
    assert (meta["version"], meta["author"], meta["verified_by"], meta["note"]) == (1, USER, "os-user", "alice")
    assert description == f"Comment on v1 by {USER}: {text}"
    assert demo.store().exists("main", meta["store_path"])


def test_the_ui_lineage_table_and_the_lineage_command_show_the_registered_record(demo):
    with dg.DagsterInstance.from_config(str(demo.home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(["digits", "model_version"]))
    metadata = event.asset_materialization.metadata
    assert metadata["version"].value == 2
    record = read_lineage(demo.store(), "digits", 2)
    ui_heading, _, ui_table = metadata["lineage"].value.partition("\n\n")
    # The evaluation op builds the record again for the UI, so only the heading's creation time
    # may differ from the stored record's.
    assert ui_heading.startswith("digits v2  (created ")
    assert ui_table == lineage_markdown(record).partition("\n\n")[2]
    text = ok(demo.cli("lineage", "digits", "--version", "2")).splitlines()
    for field, value, _ in lineage_rows(record):
        assert any(line.startswith(f"  {field:<15} {value}") for line in text), (field, value)


def test_promote_and_rollback_move_the_production_alias_with_an_audit_trail(demo):
    assert "production none -> v1" in ok(demo.cli("promote", "digits", "1", "--by", "alice"))
    assert "production v1 -> v2" in ok(demo.cli("promote", "digits", "2", "--by", "bob"))
    assert "production v2 -> v1" in ok(demo.cli("rollback", "digits", "--by", "carol"))
    assert (f'v1 is in production, not this version (rollback by {USER} (OS user, not authenticated), note "carol"'
            in ok(demo.cli("lineage", "digits")))
    alias = read_alias(demo.store(), "digits")
    assert alias["version"] == 1
    # --by is a note; the identity is the one the platform verified (here the OS user, not authenticated).
    assert [(h["action"], h["from"], h["to"], h["by"], h["note"]) for h in alias["history"]] == [
        ("promote", None, 1, USER, "alice"), ("promote", 1, 2, USER, "bob"), ("rollback", 2, 1, USER, "carol")]
    assert all(h["at"] and h["actor"]["verified_by"] == "os-user" for h in alias["history"])
    assert f"since the rollback by {USER} (OS user, not authenticated)" in ok(demo.cli("versions", "digits"))
    moves = observations(demo, ("promote", "rollback"))
    assert [(m["kind"], m["production_version"], m["by"], m["note"]) for _, m in moves] == [
        ("promote", 1, USER, "alice"), ("promote", 2, USER, "bob"), ("rollback", 1, USER, "carol")]
    # Nothing before v1: a second rollback is refused and leaves the alias alone.
    error = one_line_error(demo.cli("rollback", "digits"), 2)
    assert "no earlier one to roll back to" in error
    assert read_alias(demo.store(), "digits")["version"] == 1


def test_unknown_models_and_versions_are_one_line_errors(demo):
    # A name the store does not know is looked up in the workspace's code locations (pipelines/cli/lookup.py).
    assert one_line_error(demo.cli("lineage", "nosuchmodel"), 2).startswith(
        "error: no pipeline named 'nosuchmodel' in code location(s) platform, vision of ")
    assert one_line_error(demo.cli("compare", "digits", "1", "9"), 2) == \
        "error: model 'digits' has no version 9; registered versions: 1, 2"
    assert "no version 9" in one_line_error(demo.cli("promote", "digits", "9"), 2)
    assert "no pipeline named 'ghost'" in one_line_error(demo.cli("comment", "ghost", "1", "hi"), 2)
    assert one_line_error(demo.cli("lineage", "digits_wide"), 2) == (
        "error: model 'digits_wide' (code location 'vision') has no registered versions yet; train it with "
        "`python -m pipelines train digits_wide` or run its job digits_wide_training")


def test_reproduce_retrains_from_the_lineage_record_and_reports_differences(demo):
    result = demo.cli("reproduce", "digits", "1", "--exact", timeout=600)
    out = ok(result)
    record = read_lineage(demo.store(), "digits", 1)
    assert out.startswith(f"Reproducing digits v1: shards commit {record['data']['shards_commit'][:12]}, seed 0, 2 rank(s)")
    for figure in ("final training loss", "test accuracy", "validation loss"):
        assert row(out, *figure.split())[len(figure.split())] == \
            row(out, *figure.split())[len(figure.split()) + 1]  # same to 4 decimals
    assert row(out, "steps")[1:3] == [str(record["training_figures"]["steps"])] * 2
    assert "Reproduced: every figure matches within 1e-06, and the weights are the same bytes" in out
    work_dir = out.splitlines()[0].split("work dir ")[1]
    report = json.loads((Path(work_dir) / "reproduction.json").read_text())
    assert report["original_run"] == record["dagster"]["run_id"]
    judged = [f for f in report["figures"] if f["within_tolerance"] is not None]
    assert judged and all(f["within_tolerance"] for f in judged)
    config = json.loads((Path(work_dir) / "config.json").read_text())
    assert config["data"]["commit_id"] == record["data"]["shards_commit"]
    assert config["train"] == record["training"]["config"]["train"]
    assert config["model"] == record["training"]["config"]["model"]
    # The record was made from this repository; a dirty checkout or another commit is called out.
    if record["code"].get("dirty"):
        assert "uncommitted changes" in result.stderr


def test_datasets_lists_each_version_with_its_counts_checks_and_models(demo):
    out = ok(demo.cli("datasets", "digits"))
    v1, v2 = read_lineage(demo.store(), "digits", 1), read_lineage(demo.store(), "digits", 2)
    assert (v1["data"]["dataset_version"], v2["data"]["dataset_version"]) == ("digits-d1", "digits-d2")
    first, second = row(out, "digits-d1"), row(out, "digits-d2")
    assert first[2] == v1["data"]["shards_commit"][:12] and second[2] == v2["data"]["shards_commit"][:12]
    counts = [sum(int(n) for n in r[3:8:2]) for r in (first, second)]
    assert counts[0] - counts[1] == DROPPED_ROWS  # v2 was trained without the first rows
    assert "raw_dataset passed" in out and "shards passed" in out
    assert out.rstrip().endswith("digits v2") and "digits v1" in out.splitlines()[2]
    assert json.loads(ok(demo.cli("datasets", "digits", "--json")))[1]["models"] == ["digits v2"]
    assert ok(demo.cli("datasets")).split() == ["digits"]


def test_housekeeping_is_a_dry_run_unless_asked(demo):
    before = sorted(demo.store().list_branches())
    out = ok(demo.cli("housekeeping", "--older-than-days", "0.000001"))
    assert "Dry run: nothing was deleted" in out
    assert sorted(demo.store().list_branches()) == before
    # Both demo runs registered their versions, merging their run branches into main: merged
    # branches go (their commits stay reachable from main, where the lineage points).
    deleting = [line for line in out.splitlines() if line.startswith("delete")]
    assert {b for b in before if b.startswith("run-")} <= {line.split()[2] for line in deleting}
    assert "to delete" in out.splitlines()[-2]


def test_workspace_and_scaffold(demo, tmp_path):
    out = ok(demo.cli("workspace"))
    assert "vision: digits_wide (reads digits from platform)" in out
    assert ok(demo.cli("scaffold", "training", "digits_small", "--defs-dir", str(tmp_path))).startswith("Wrote ")
    assert "model_name:  # REQUIRED" in (tmp_path / "digits_small" / "defs.yaml").read_text()
    assert one_line_error(demo.cli("scaffold", "training", "digits_small", "--defs-dir", str(tmp_path)), 2)
