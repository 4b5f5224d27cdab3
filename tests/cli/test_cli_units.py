"""The CLI's pure parts, the UI's lineage table, and the registry's comments and alias, without training."""

from __future__ import annotations

import argparse

import pytest

from core.registry import (
    AliasError,
    UnknownModelVersionError,
    add_comment,
    alias_path,
    empty_alias,
    list_comments,
    move_alias,
    promoted,
    read_alias,
    read_lineage,
    rolled_back,
)
from core.identity import LAKEFS, Actor
from core.lineage import MARKDOWN_FIELD_NAMES, lineage_markdown, lineage_rows
from pipelines.cli import build_parser, compare, render, reproduce
from pipelines.cli.parser import version_number
from resources.store.base import MAIN
from tests.cli.records import make_record, store_with_versions


def who(name: str) -> Actor:
    """A lakeFS user, as the registry records one it verified."""
    return Actor(name, LAKEFS, True, f"lakeFS user behind a test key")


def test_compare_marks_exactly_the_fields_that_differ():
    a = make_record(1)
    b = make_record(2, **{"training.config.train.lr": 0.01, "evaluation.test.accuracy": 0.97,
                          "data.shards_commit": "3" * 64})
    rows = {(section, key): (vals, differs) for section, key, vals, differs in compare.compare_rows([a, b])}
    assert rows[("parameters", "train.lr")] == ([0.003, 0.01], True)
    assert rows[("parameters", "train.epochs")] == ([3, 3], False)
    assert rows[("metrics", "test accuracy")] == ([0.95, 0.97], True)
    assert rows[("data and code", "shards commit")][1] is True
    assert rows[("data and code", "raw commit")][1] is False
    # Where files were written is not a parameter; the pinned data is shown as commits instead.
    assert not any(k.startswith(("data.", "checkpoint.dir", "output_dir")) for _, k in rows)
    assert ("parameters", "checkpoint.every_steps") in rows


def test_compare_table_shows_values_side_by_side_with_marks():
    a, b = make_record(1), make_record(2, **{"training.config.train.seed": 7})
    text = render.format_compare([a, b])
    seed = next(line for line in text.splitlines() if " train.seed " in line)
    assert seed.split() == ["*", "train.seed", "0", "7"]
    epochs = next(line for line in text.splitlines() if " train.epochs " in line)
    assert epochs.split() == ["train.epochs", "3", "3"]
    assert "(* marks 1 field(s) that differ)" in text.splitlines()[0]
    only = render.format_compare([a, b], only_differences=True)
    assert "train.epochs" not in only and "train.seed" in only


def test_compare_handles_a_field_only_one_version_has():
    a = make_record(1)
    b = make_record(2, **{"training.config.train.warmup_steps": 5})
    rows = {key: (vals, d) for _, key, vals, d in compare.compare_rows([a, b, make_record(3)])}
    assert rows["train.warmup_steps"] == (["—", 5, "—"], True)


def test_format_value_shortens_commit_ids_and_rounds_floats():
    assert render.format_value("ab" * 32) == "ab" * 6
    assert render.format_value(0.123456) == "0.1235"
    assert render.format_value(0.0000123) == "1.230e-05"
    assert render.format_value([128, 64]) == "[128, 64]"
    assert render.format_value(None) == "None"


def test_diff_table_lists_changed_objects_and_only_differing_fields():
    a = make_record(1)
    b = make_record(2, **{"training.config.train.epochs": 4, "evaluation.test.loss": 0.1})
    rows = [("changed", "datasets/toy/raw/data.parquet", 1000, 900),
            ("added", "datasets/toy/shards/train/00004.bin", None, 512)]
    text = render.format_diff(a, b, rows)
    lines = text.splitlines()
    assert lines[0] == "toy: v1 -> v2"
    assert any(line.split() == ["changed", "datasets/toy/raw/data.parquet", "1,000", "B", "900", "B"] for line in lines)
    assert any(line.split()[:2] == ["added", "datasets/toy/shards/train/00004.bin"] and "—" in line for line in lines)
    assert "  0 removed" not in text and "1 added, 0 removed, 1 changed" in text
    assert any(line.split() == ["train.epochs", "3", "4"] for line in lines)
    assert any(line.split() == ["test", "loss", "0.1200", "0.1000"] for line in lines)
    assert "train.lr" not in text  # equal parameters are left out of a diff


def test_diff_of_versions_on_the_same_data_says_so():
    text = render.format_diff(make_record(1), make_record(2), [])
    assert "no objects differ" in text
    assert text.count("(no differences)") == 2


def test_reproduction_config_points_at_the_recorded_commit_and_a_new_work_dir(tmp_path):
    record = make_record(1)
    manifest = {"splits": {"train": {"num_samples": 100}}}
    config = reproduce.reproduction_config(record, manifest, {"train/0.bin": "file:///x"}, tmp_path)
    assert set(config) == {"model", "data", "train", "checkpoint", "output_dir"}
    assert config["data"]["commit_id"] == record["data"]["shards_commit"]
    assert config["data"]["locations"] == {"train/0.bin": "file:///x"}
    assert config["checkpoint"] == {"dir": str(tmp_path / "checkpoints"), "every_steps": 40}
    assert config["output_dir"] == str(tmp_path / "output")
    assert config["train"]["seed"] == 0
    assert record["training"]["config"]["output_dir"] == "/tmp/out"  # the record is not modified


def test_a_record_without_a_sample_order_reproduces_in_the_global_order_it_trained_in(tmp_path):
    """Records made before data.sample_order trained in DistributedSampler's order; newer ones say theirs."""
    old = make_record(1)
    assert "sample_order" not in old["training"]["config"]["data"]
    assert reproduce.reproduction_config(old, {}, {}, tmp_path)["data"]["sample_order"] == "global"
    new = make_record(1)
    new["training"]["config"]["data"].update(sample_order="partitioned", partitions=4)
    data = reproduce.reproduction_config(new, {}, {}, tmp_path)["data"]
    assert (data["sample_order"], data["partitions"]) == ("partitioned", 4)


def test_reproduction_config_refuses_an_inconsistent_record(tmp_path):
    record = make_record(1, **{"training.config.data.commit_id": "9" * 64})
    with pytest.raises(ValueError, match="inconsistent"):
        reproduce.reproduction_config(record, {}, {}, tmp_path)


def test_reproduction_rows_flag_differences_beyond_tolerance():
    record = make_record(1)
    repro = {"final_loss": 0.05, "steps": 12, "weights_sha256": "b" * 64, "max_weight_difference": 3e-8,
             "test": {"accuracy": 0.95, "loss": 0.1200001}, "validation": {"accuracy": 0.8, "loss": 0.2}}
    rows = {name: ok for name, _, _, ok in reproduce.reproduction_rows(record, repro, tolerance=1e-6)}
    assert rows == {"final training loss": True, "steps": True, "test accuracy": True, "test loss": True,
                    "validation accuracy": False, "validation loss": True, "weights sha256": None,
                    "max |weight difference|": None}
    text = render.format_reproduction(record, reproduce.reproduction_rows(record, repro, 1e-6), 1e-6)
    marked = [line.split()[1:3] for line in text.splitlines() if line.lstrip().startswith("*")]
    assert marked == [["validation", "accuracy"]]


def test_max_weight_difference_compares_tensors_of_either_weights_format():
    import io

    import torch
    from safetensors.torch import save

    def pickled(sd):  # versions registered before model cards kept weights.pt
        buf = io.BytesIO()
        torch.save(sd, buf)
        return reproduce.load_state(buf.getvalue(), "weights.pt")

    def safetensors(sd):
        return reproduce.load_state(save(sd), "model.safetensors")

    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([1.0, 2.25]), "b": torch.tensor([0.5])}
    assert reproduce.max_weight_difference(pickled(a), safetensors(a)) == 0.0
    assert reproduce.max_weight_difference(safetensors(a), safetensors(b)) == 0.25
    assert reproduce.max_weight_difference(pickled(a), pickled({"w": torch.zeros(3), "b": torch.zeros(1)})) == float("inf")


def test_code_warnings():
    same = {"git_sha": "abc", "dirty": False}
    assert reproduce.code_warnings(1, same, same) == []
    warnings = reproduce.code_warnings(3, same, {"git_sha": "def", "dirty": True})
    assert len(warnings) == 2 and warnings[0].startswith("code differs: v3 was trained at git abc")
    assert "uncommitted" in warnings[1]
    assert "cannot be recovered" in reproduce.code_warnings(1, {"git_sha": "abc", "dirty": True}, same)[0]


def test_version_numbers_accept_v_prefix_and_refuse_garbage():
    assert version_number("3") == 3 and version_number("v12") == 12
    for bad in ("x", "v", "0", "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            version_number(bad)


def test_lineage_text_shows_production_and_comments():
    record = make_record(2)
    alias = promoted(empty_alias("toy"), 2, who("alice"), "2026-11-29T11:00:00+00:00", note="release board")
    comments = [{"created_at": "2026-11-29T11:05:00+00:00", "author": "bob", "text": "looks good"},
                {"created_at": "2026-11-29T11:06:00+00:00", "author": "carol", "actor": who("carol").to_record(),
                 "note": None, "text": "agreed"}]
    text = render.format_lineage(record, {"raw_commit": "1", "shards_commit": "2"}, production=alias, comments=comments)
    assert ('  production      this version, v2, is in production (promote by alice (lakeFS user, authenticated by '
            'lakeFS), note "release board" at 2026-11-29T11:00:00+00:00)') in text
    # A comment written before identities were verified says its name was only typed.
    assert ("    2026-11-29T11:05:00+00:00  bob (self-declared: recorded before identities were verified): looks good"
            in text)
    assert "    2026-11-29T11:06:00+00:00  carol (lakeFS user, authenticated by lakeFS): agreed" in text
    other = render.format_lineage(make_record(1), {}, production=alias)
    assert "v2 is in production, not this version" in other
    assert "no version is in production" in render.format_lineage(record, {}, production=empty_alias("toy"))


def test_ui_markdown_and_cli_text_show_the_same_lineage_facts():
    record = make_record(2, links={"raw": "http://lakefs/raw", "shards": "http://lakefs/shards"},
                         checks={"shard_dataset": {"passed": False, "evaluated": 7}, "dataset": "toy"})
    heading, *lines = render.format_lineage(record, None).splitlines()
    cli_values = {line[2:17].rstrip(): line[18:] for line in lines}  # "  <field, 15 wide> <value>"
    markdown_heading, _, markdown_table = lineage_markdown(record).partition("\n\n")
    header, rule, *cells = markdown_table.splitlines()
    assert (header, rule) == ("| field | value |", "| --- | --- |")
    ui_values = dict(cell[2:-2].split(" | ", 1) for cell in cells)
    assert markdown_heading == heading == "toy v2  (created 2026-11-29T10:00:00+00:00)"
    rows = lineage_rows(record)
    assert list(cli_values) == [row.field for row in rows]
    # The UI adds the data checks only; its raw commit row keeps the longer name it always had.
    assert list(ui_values) == [MARKDOWN_FIELD_NAMES.get(row.field, row.field) for row in rows] + ["data checks"]
    assert ui_values["data checks"] == "shard_dataset: FAILED (7 expectations)"
    for field, value, url in rows:
        ui, cli = ui_values[MARKDOWN_FIELD_NAMES.get(field, field)], cli_values[field]
        if url is None:
            assert ui == cli == value
        else:  # a link in Markdown, the address beside the value in the terminal
            assert ui == f"[{value}]({url})" and value in cli and url in cli
    assert ui_values["raw data commit"] == cli_values["raw commit"] == "1" * 64
    assert cli_values["dagster run"] == "run-1  http://localhost:3000/runs/run-1"
    assert cli_values["test"] == ui_values["test"] == "accuracy=0.9500 loss=0.1200 (n=20)"


# --- the production alias as pure state transitions ------------------------------------------------
def test_promote_and_rollback_walk_back_through_earlier_versions():
    s = empty_alias("toy")
    s = promoted(s, 1, who("a"), "t1")
    s = promoted(s, 2, who("b"), "t2")
    s = promoted(s, 3, who("c"), "t3")
    assert (s["version"], s["previous"]) == (3, [1, 2])
    s = rolled_back(s, who("d"), "t4")
    assert (s["version"], s["previous"]) == (2, [1])
    s = rolled_back(s, who("e"), "t5")
    assert (s["version"], s["previous"]) == (1, [])
    with pytest.raises(AliasError, match="no earlier one"):
        rolled_back(s, who("f"), "t6")
    assert [(h["action"], h["from"], h["to"], h["by"]) for h in s["history"]] == [
        ("promote", None, 1, "a"), ("promote", 1, 2, "b"), ("promote", 2, 3, "c"),
        ("rollback", 3, 2, "d"), ("rollback", 2, 1, "e")]


def test_promoting_the_current_version_or_rolling_back_nothing_is_refused():
    with pytest.raises(AliasError, match="no production version"):
        rolled_back(empty_alias("toy"), who("a"), "t")
    with pytest.raises(AliasError, match="already in production"):
        promoted(promoted(empty_alias("toy"), 1, who("a"), "t"), 1, who("a"), "t")


# --- comments and the alias in a real local store ----------------------------------------------------
def test_comments_are_committed_to_main_and_listed_per_version(tmp_path):
    store = store_with_versions(tmp_path / "store")
    first = add_comment(store, "toy", 1, "baseline", who("alice"), created_at="2026-11-29T10:00:00+00:00")
    add_comment(store, "toy", 2, "more data", who("bob"), created_at="2026-11-29T10:01:00+00:00")
    add_comment(store, "toy", 1, "still fine", who("carol"), created_at="2026-11-29T10:02:00+00:00")
    assert store.resolve_ref(MAIN) == store.get_commit(MAIN).id == store.log(MAIN)[0].id
    assert [c["text"] for c in list_comments(store, "toy", 1)] == ["baseline", "still fine"]
    assert [c["author"] for c in list_comments(store, "toy")] == ["alice", "bob", "carol"]
    commit = store.log(first["commit_id"], limit=2)[1]  # the branch commit merged into main
    assert commit.metadata["author"] == "alice" and commit.metadata["model_version"] == "1"
    assert not [b for b in store.list_branches() if b.startswith("comment-")]  # work branches removed
    with pytest.raises(UnknownModelVersionError, match="no version 9"):
        add_comment(store, "toy", 9, "x", who("alice"))
    with pytest.raises(UnknownModelVersionError, match="no registered versions"):
        add_comment(store, "nope", 1, "x", who("alice"))


def test_alias_moves_are_audited_on_main(tmp_path):
    store = store_with_versions(tmp_path / "store", versions=3)
    move_alias(store, "toy", "promote", who("alice"), version=1, at="t1")
    move_alias(store, "toy", "promote", who("bob"), version=3, at="t2")
    entry = move_alias(store, "toy", "rollback", who("carol"), at="t3", note="on behalf of dave")
    assert (entry["from"], entry["to"], entry["by"]) == (3, 1, "carol")
    state = read_alias(store, "toy")
    assert state["version"] == 1
    assert [(h["action"], h["to"], h["by"], h["at"]) for h in state["history"]] == [
        ("promote", 1, "alice", "t1"), ("promote", 3, "bob", "t2"), ("rollback", 1, "carol", "t3")]
    assert (state["history"][-1]["actor"]["verified_by"], state["history"][-1]["note"]) == ("lakefs", "on behalf of dave")
    head = store.get_commit(MAIN)
    assert head.metadata["action"] == "rollback" and head.metadata["from_version"] == "3"
    assert (head.metadata["by_verified_by"], head.metadata["note"]) == ("lakefs", "on behalf of dave")
    assert store.exists(MAIN, alias_path("toy"))
    with pytest.raises(UnknownModelVersionError, match="no version 7"):
        move_alias(store, "toy", "promote", who("alice"), version=7)
    with pytest.raises(AliasError, match="no earlier one"):
        move_alias(store, "toy", "rollback", who("alice"))
    assert read_alias(store, "toy")["version"] == 1  # a refused move changes nothing


def test_an_empty_store_is_an_unknown_model_not_a_crash(tmp_path):
    from resources.store.factory import make_store

    store = make_store("local", root=tmp_path / "store", repository="model-factory")
    with pytest.raises(UnknownModelVersionError, match="no model versions yet"):
        read_lineage(store, "toy")


COMMANDS = ("demo", "train", "sweeps", "lineage", "versions", "compare", "diff", "reproduce", "comment", "promote", "rollback",
            "datasets", "housekeeping", "workspace", "scaffold")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m pipelines {command}")
    assert "-h, --help" in out


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


def test_reproduction_rows_cover_every_metric_a_task_records():
    from tests.cli.records import make_record

    original = make_record(evaluation={"test": {"loss": 0.5, "perplexity": 1.65, "accuracy": 0.4, "num_tokens": 900,
                                           "num_samples": 7},
                                  "validation": {"loss": 0.6, "perplexity": 1.82, "accuracy": 0.38,
                                                 "num_tokens": 800, "num_samples": 6}})
    repro = {"final_loss": original["training_figures"]["final_loss"], "steps": original["training_figures"]["steps"],
             "weights_sha256": "b" * 64, "max_weight_difference": 0.0,
             "test": {"loss": 0.5, "perplexity": 1.65, "accuracy": 0.4},
             "validation": {"loss": 0.6, "perplexity": 1.9, "accuracy": 0.38}}
    rows = {name: ok for name, _, _, ok in reproduce.reproduction_rows(original, repro, tolerance=1e-3)}
    assert rows["test perplexity"] is True and rows["validation perplexity"] is False
    assert "test num_tokens" not in rows and "test num_samples" not in rows
