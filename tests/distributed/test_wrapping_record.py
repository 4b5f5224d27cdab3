"""The sharding, FSDP's units and activation checkpointing are said in the run's log, kept in
resolved_config.json (``wrapping``) and shown in the lineage's training row."""

from __future__ import annotations

import json
from pathlib import Path

from core.lineage import sharding_fact
from tests.distributed.user_blocks import team_net
from tests.runtime.helpers import make_config, make_dataset
from training_runtime.config import RunConfig
from training_runtime.distributed.fsdp import describe_wrapping, wrapping_summary
from training_runtime.train.trainer import Trainer


class Collect:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def custom(self, payload) -> None:
        pass


def test_the_summary_names_units_by_class_and_policy():
    model = team_net([16], 4, width=32, blocks=3)
    named = wrapping_summary(model, "fsdp", ["TeamBlock"], None, True)
    assert named == {"sharding": "fsdp", "activation_checkpointing": True, "units": 3,
                     "unit_classes": {"TeamBlock": 3}, "unit_policy": "by class name"}
    assert describe_wrapping(named) == ("sharding fsdp, 3 FSDP units (TeamBlock x3; by class name), "
                                        "activation checkpointing on")
    small = wrapping_summary(model, "fsdp")  # far below 2**20 parameters: the root alone
    assert "no FSDP units besides the root (by size)" in describe_wrapping(small)
    assert describe_wrapping(wrapping_summary(model, "ddp")) == "sharding ddp, activation checkpointing off"


def test_the_lineage_row_reads_the_record_and_older_configs():
    wrapping = wrapping_summary(team_net([16], 4, width=32, blocks=3), "fsdp", ["TeamBlock"], None, True)
    assert sharding_fact({"train": {"sharding": "fsdp"}, "wrapping": wrapping}) == (
        " sharding=fsdp fsdp_units=3 (TeamBlock x3; by class name) activation_checkpointing=on")
    assert sharding_fact({"train": {"sharding": "ddp"}}) == " sharding=ddp"
    assert sharding_fact({"train": {"sharding": "fsdp", "fsdp_units": "Block"}}) == " sharding=fsdp fsdp_units=Block"
    assert sharding_fact({"train": {}}) == ""  # a record of a runtime that predates the setting


def test_a_training_logs_and_records_its_wrapping(tmp_path, world_of_one):
    manifest, locations = make_dataset(tmp_path, n_train=32, n_test=16, per_shard=16)
    d = make_config(tmp_path, manifest, locations, model="tests.distributed.user_blocks:team_net", model_kwargs={},
                    sharding="fsdp", fsdp_units="TeamBlock", activation_checkpointing=True, epochs=1)
    reporter = Collect()
    Trainer(RunConfig.from_dict(d), world_of_one, reporter).run()
    said = "model tests.distributed.user_blocks:team_net: sharding fsdp, 3 FSDP units (TeamBlock x3; by class name)"
    assert any(line.startswith(said) and line.endswith("activation checkpointing on") for line in reporter.lines)
    resolved = json.loads(Path(d["output_dir"], "resolved_config.json").read_text())
    assert resolved["wrapping"]["units"] == 3 and resolved["wrapping"]["activation_checkpointing"] is True
