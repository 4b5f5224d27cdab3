"""Guard settings are pipeline settings: set in Python, in a YAML block and in run config (the
Launchpad and ``--set``), each described, and checked when definitions load by the runtime's own
rules, the hang timeout below the collective timeout included; the runtime gets them as set."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import dagster as dg
import pytest

from core.overrides import OverrideError, apply_overrides, override_record, overrides_config_schema, parse_set
from core.spec import Guards, PipelineDefinitionError, model_pipeline
from ops.training_config import runtime_config
from pipelines.components import BlockDefinitionError
from tests.pipeline.test_components import FLOWERS, defs, training_block  # noqa: F401 (defs is a fixture)
from training_runtime.config import GuardsConfig

TABLE = dict(source="x.csv", features=["a", "b"], label="y", classes=["p", "q"])


def pipeline(**kw):
    return model_pipeline("m", **TABLE, **kw)


def test_python_guards_reach_the_runtime_config_as_set():
    spec = pipeline(guards={"hang_timeout_s": 120.0, "data_stall_share": None}, recipe={"collective_timeout_s": 240.0})
    assert spec.guards == Guards(hang_timeout_s=120.0, data_stall_share=None) and Guards is GuardsConfig
    config = runtime_config(spec, manifest={"splits": {"train": {}, "validation": {}}}, locations={},
                            commit_id="c", checkpoint_dir=Path("/w/checkpoints"), output_dir=Path("/w/output"), launch=3)
    assert config["guards"] == dataclasses.asdict(spec.guards) and config["launch"] == 3
    assert config["guards"]["hang_timeout_s"] == 120.0 and config["train"]["collective_timeout_s"] == 240.0
    assert pipeline().guards.hang_timeout_s == 300.0  # the default, no longer derived from the collective timeout
    assert pipeline(guards=Guards(hang_timeout_s=None)).guards.hang_timeout_s is None  # no watchdog


@pytest.mark.parametrize("kw, field, says", [
    (dict(recipe={"collective_timeout_s": 200.0}), "guards.hang_timeout_s",
     "(300) must be below recipe.collective_timeout_s (200)"),
    (dict(guards={"hang_timeout_s": 600.0}), "guards.hang_timeout_s", "must be below recipe.collective_timeout_s (600)"),
    (dict(guards={"hang_timeout_s": "soon"}), "guards.hang_timeout_s", "must be float or null, got 'soon'"),
    (dict(guards={"nonfinite_skip_batches": -1}), "guards.nonfinite_skip_batches", "must be >= 0"),
    (dict(guards={"nonfinite_skip_batches": 2}, train="tests.runtime.user_train:main"),
     "guards.nonfinite_skip_batches", "skips batches inside the built-in trainer"),
    (dict(guards={"data_stall_share": 1.5}), "guards.data_stall_share", "between 0 and 1"),
    (dict(guards={"straggler_factor": 0.9}), "guards.straggler_factor", "above 1"),
    (dict(guards={"hang_timeout": 60}), "guards", "the fields are"),
])
def test_a_bad_guard_setting_is_refused_when_definitions_load_naming_the_field(kw, field, says):
    with pytest.raises(PipelineDefinitionError, match=re.escape(f"pipeline 'm', field '{field}': ") + ".*"
                       + re.escape(says)):
        pipeline(**kw)


def test_yaml_guards_are_the_same_settings_and_errors_point_at_their_line(defs):  # noqa: F811
    defs.write("flowers", FLOWERS)
    defs.write("iris_mlp", training_block("iris_mlp", more="  guards:\n    hang_timeout_s: 90\n"
                                                             "    nonfinite_skip_batches: 2\n"))
    spec = next(s for s in defs.specs() if s.name == "iris_mlp")
    assert spec.guards == Guards(hang_timeout_s=90.0, nonfinite_skip_batches=2)

    path = defs.write("iris_slow", training_block("iris_slow", more="  guards:\n    hang_timeout_s: 900\n"))
    with pytest.raises(BlockDefinitionError) as raised:
        defs.specs()
    assert str(raised.value).startswith(f"{path}:7: field 'guards.hang_timeout_s': (900) must be below "
                                        "recipe.collective_timeout_s (600)")


def test_run_config_and_set_change_guards_for_one_run_checked_as_the_pipelines_own():
    spec = pipeline()
    overrides = parse_set(["guards.hang_timeout_s=120", "guards.nonfinite_skip_batches=3"])
    assert overrides == {"guards": {"hang_timeout_s": 120, "nonfinite_skip_batches": 3}}
    run = apply_overrides(spec, overrides)
    assert (run.guards.hang_timeout_s, run.guards.nonfinite_skip_batches) == (120.0, 3)
    assert spec.guards.hang_timeout_s == 300.0  # the pipeline itself is unchanged
    assert override_record(spec, overrides) == {"guards.hang_timeout_s": {"pipeline": 300.0, "run": 120},
                                                "guards.nonfinite_skip_batches": {"pipeline": 0, "run": 3}}
    for items, says in ((["guards.hang_timeout_s=900"], "field 'guards.hang_timeout_s': (900) must be below"),
                        (["guards.hang_timeout=9"], "override guards.hang_timeout: guards has no field"),
                        (["guards.enabled=1"], "override guards.enabled: 1 is not a bool")):
        with pytest.raises(OverrideError, match=re.escape(says)):
            apply_overrides(spec, parse_set(items))


def test_the_launchpad_describes_every_guard_setting_with_the_pipelines_value():
    def training(context):
        return None

    op = dg.op(config_schema=overrides_config_schema(pipeline(guards={"hang_timeout_s": 120.0})))(training)
    guards = op.config_schema.config_type.fields["guards"].config_type.fields
    assert set(guards) == {f.name for f in dataclasses.fields(GuardsConfig)}
    assert not any(f.is_required for f in guards.values())
    assert guards["hang_timeout_s"].description.startswith("Fail the attempt, printing every thread's stack")
    assert guards["hang_timeout_s"].description.endswith("The pipeline says 120.0.")
    from dagster._config import process_config

    assert process_config(op.config_schema.config_type, {"guards": {"hang_timeout_s": None}}).success
    assert not process_config(op.config_schema.config_type, {"guards": {"hang_timeout_s": "soon"}}).success
