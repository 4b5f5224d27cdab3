"""The pure parts of elastic gangs: the recipe's checks, the sizes and partitions, the resizes read
from attempts, rank 0's attempt names, the local launch command and the kept rank logs' names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.lineage import resizes_summary
from core.spec import PipelineDefinitionError, PipelineSpec, Recipe, Source
from ops.training_config import runtime_config, training_job
from resources.launch.base import TrainingJob
from resources.launch.local import torchrun_command
from resources.launch.rank_logs import artifact_name
from training_runtime.distributed.elastic import elastic_partitions, parse_elastic, resizes, world_sizes
from training_runtime.observe.attempts import AttemptId, elastic_attempt


def _spec(**recipe):
    return PipelineSpec(name="toy", source=Source(paths=("x.csv",)), feature_columns=("a", "b"), label_column="y",
                        class_names=("0", "1"), model="mlp", recipe=Recipe(**recipe))


def test_world_sizes_and_the_partitions_every_size_divides():
    assert world_sizes(2, 4, 2) == [4, 6, 8]
    assert elastic_partitions(2, 4, 2) == 24 and elastic_partitions(1, 2, 1) == 2
    assert all(elastic_partitions(1, 3, 4) % w == 0 for w in world_sizes(1, 3, 4))
    assert parse_elastic("1:3") == (1, 3) and parse_elastic("") is None and parse_elastic(None) is None
    with pytest.raises(ValueError):
        world_sizes(3, 2, 1)


@pytest.mark.parametrize("recipe, field, says", [
    ({"nnodes": 2, "min_nodes": 3}, "recipe.min_nodes", "must be between 1 and nnodes (2)"),
    ({"nnodes": 2, "min_nodes": 0}, "recipe.min_nodes", "must be between 1 and nnodes"),
    ({"nnodes": 3, "min_nodes": 1, "max_restarts": 0}, "recipe.max_restarts", "each lost node uses one restart"),
    ({"nnodes": 2, "min_nodes": 1, "sharding": "hsdp"}, "recipe.sharding", "cannot resize"),
    # 1..3 nodes of 2 ranks: world sizes 2, 4, 6; 64 is not divisible by 6
    ({"nnodes": 3, "min_nodes": 1, "batch_size": 64}, "recipe.batch_size",
     "runs at world sizes [2, 4, 6], so choose a multiple of 12"),
])
def test_an_elastic_recipe_that_cannot_hold_at_every_size_is_refused_when_definitions_load(recipe, field, says):
    with pytest.raises(PipelineDefinitionError, match=rf"field '{field}'") as err:
        _spec(**recipe)
    assert says in str(err.value)


def test_an_elastic_recipe_sets_the_partitions_and_the_job_its_range(tmp_path):
    spec = _spec(nnodes=3, min_nodes=1, batch_size=48, world_size=2)
    manifest = {"splits": {"train": {}, "validation": {}}}
    config = runtime_config(spec, manifest=manifest, locations={}, commit_id="c", checkpoint_dir=tmp_path / "ckpt",
                            output_dir=tmp_path / "out")
    assert config["data"]["partitions"] == 12  # lcm(2, 4, 6)
    job = training_job(spec, "run12345", config)
    assert (job.min_nodes, job.nnodes, job.elastic, job.nnodes_arg) == (1, 3, True, "1:3")
    fixed = training_job(_spec(nnodes=2), "run12345", config)
    assert (fixed.elastic, fixed.nnodes_arg) == (False, "2")
    assert "partitions" not in runtime_config(_spec(nnodes=2), manifest=manifest, locations={}, commit_id="c",
                                              checkpoint_dir=tmp_path / "c", output_dir=tmp_path / "o")["data"]


def test_resizes_are_read_from_consecutive_attempts_world_sizes():
    attempts = [{"name": "a", "world_size": 4, "started_at": 1.0, "resumed_from_step": None},
                {"name": "b", "world_size": 4, "started_at": 2.0, "resumed_from_step": 8},  # a plain restart
                {"name": "c", "world_size": 2, "started_at": 3.0, "resumed_from_step": 12},
                {"name": "d", "world_size": None, "started_at": 4.0},  # killed before it recorded a size
                {"name": "e", "world_size": 4, "started_at": 5.0, "resumed_from_step": 20}]
    found = resizes(attempts)
    assert [(r["attempt"], r["from_world_size"], r["to_world_size"], r["resumed_from_step"]) for r in found] == [
        ("c", 4, 2, 12), ("e", 2, 4, 20)]
    assert "a node left" in found[0]["reason"] and "a node joined" in found[1]["reason"]
    text = resizes_summary(found)
    assert text.startswith("2: 4 -> 2 ranks from step 12, 1970-01-01 00:00:03 UTC (a node left")


def test_rank_zero_numbers_an_elastic_gangs_attempts_in_the_order_they_start(tmp_path):
    proposed = AttemptId(2, 1, "job")  # this agent's own restart count: 1
    assert elastic_attempt(tmp_path, proposed) == AttemptId(2, 0, "job")
    for name in ("L002-R000-job", "L002-R001-job", "L001-R007-job"):
        (tmp_path / name).mkdir()
    assert elastic_attempt(tmp_path, proposed) == AttemptId(2, 2, "job")  # another launch's do not count


def test_a_local_gang_of_several_nodes_runs_under_the_gang_launcher(tmp_path):
    cfg = {"checkpoint": {"dir": str(tmp_path / "ckpt")}}
    job = TrainingJob(name="j", config=cfg, nproc_per_node=2, nnodes=3, min_nodes=2, max_restarts=4)
    cmd = torchrun_command(job, tmp_path / "config.json", "python", log_dir=tmp_path / "logs", devices=["0"] * 6)
    assert cmd[:3] == ["python", "-m", "resources.launch.gang"]
    assert {"--nodes", "2:3", "--nproc=2", "--run-id=j", "--max-restarts=4", f"--log-dir={tmp_path / 'logs'}",
            "--devices=0,0,0,0,0,0"} <= set(cmd)
    assert cmd[cmd.index("--") + 1:] == ["-m", "training_runtime", "--config", str(tmp_path / "config.json")]
    single = torchrun_command(dataclasses.replace(job, nnodes=1, min_nodes=None), tmp_path / "config.json", "python")
    assert "resources.launch.supervise" in single and "--standalone" in single


def test_a_gangs_rank_logs_keep_each_node_and_start_apart():
    assert artifact_name("launch_0/node_1-2/eltest_abc/attempt_0/0/stdout.log") == \
        "launch_0/node_1-2/attempt_0/local_rank_0.stdout.log"
    assert artifact_name("launch_3/eltest_abc/attempt_1/1/error.json") == "launch_3/attempt_1/rank_1.error.json"
    assert artifact_name("launch_0/nodes.json") == "launch_0/nodes.json"


def test_compare_shows_a_training_that_was_resized():
    from pipelines.cli.compare import attempts

    resized = {"training": {"resizes": resizes([{"name": "a", "world_size": 3, "started_at": 1.0},
                                                {"name": "b", "world_size": 2, "started_at": 2.0,
                                                 "resumed_from_step": 9}]),
                            "config": {"elastic": "2:3"}}}
    clean = {"training": {"resizes": [], "config": {}}}
    shown, plain = attempts(resized), attempts(clean)
    assert shown["resizes"].startswith("1: 3 -> 2 ranks from step 9") and shown["elastic nodes"] == "2:3"
    assert "resizes" not in plain and "elastic nodes" not in plain  # compare shows "—" beside the resized one


def test_a_gang_below_min_nodes_is_named_before_the_runtimes_account(tmp_path):
    import argparse

    from resources.launch.gang import _failure_message, _write_outcome
    from resources.launch.local import gang_failure
    from training_runtime.observe.attempts import LaunchOutcome

    args = argparse.Namespace(nodes=(2, 3), max_replacements=0, join_timeout_s=20.0, log_dir=str(tmp_path / "launch_1"))
    below = _failure_message(args, [1, 2], 1)
    assert below.startswith("the gang fell below min_nodes=2: node(s) 1, 2 were lost and no replacement was left")
    assert "join timeout (20 s)" in below
    assert _failure_message(args, [1], 1) == "no node runs any more; the training failed (exit code 1)"
    runtime = LaunchOutcome(False, "Connection closed by peer", (), None)
    assert gang_failure(tmp_path, runtime) == runtime  # no gang record
    (tmp_path / "launch_0").mkdir()
    (tmp_path / "launch_0" / "gang.json").write_text('{"message": "an older launch"}')
    _write_outcome(args, below, 1)
    named = gang_failure(tmp_path, runtime)
    assert named.message == f"{below}; Connection closed by peer" and not named.deterministic
    assert gang_failure(tmp_path, None) is None
