"""A team's own training function, kept in a folder outside the repository, is guarded as the
built-in trainer is (real torchrun, 2 gloo ranks): a rank that hangs is caught by the watchdog,
with every thread's stack in the log, and the restarted attempt resumes; a NaN stops the run once,
with no restart, naming step and rank and keeping the last good checkpoint; a module that cannot
be imported fails once, naming it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.runtime.helpers import judged, make_config, make_dataset, torchrun
from training_runtime.checkpoint.full import list_checkpoints, pinned
from training_runtime.observe.attempts import attempts_root, launch_outcome, read_attempts

pytestmark = pytest.mark.slow

# The team's real loop (resume, step, report, checkpoint, validate, save), the one the user-path
# tests run, copied outside the repository as a team's package would be.
TEAM_LOOP = Path(__file__).resolve().parents[1] / "user_paths" / "team_package" / "train.py"
BROKEN = '''
import team_dependency_not_installed  # the team forgot to ship it with the code


def main(ctx):
    pass
'''


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_guards")
    manifest, locations = make_dataset(root)
    team = tmp_path_factory.mktemp("team_code")  # outside the repository, as a team's package would be
    (team / "guarded_team_loop.py").write_text(TEAM_LOOP.read_text())
    (team / "broken_team_loop.py").write_text(textwrap.dedent(BROKEN))
    return root, manifest, locations, team


def _config(problem, name: str, train_fn: str = "guarded_team_loop:fit", **kw) -> dict:
    root, manifest, locations, _ = problem
    cfg = make_config(root, manifest, locations, name=name, **kw)
    cfg["train_fn"] = train_fn
    return cfg


def _run(problem, cfg: dict, **kw):
    root, team = problem[0], problem[3]
    return torchrun(cfg, root / f"{Path(cfg['output_dir']).parent.name}.json", python_path=(team,), **kw)


def _attempts(cfg: dict):
    return read_attempts(attempts_root(cfg["checkpoint"]["dir"]))


def test_a_hung_rank_is_caught_with_stacks_and_the_restarted_attempt_resumes(problem):
    cfg = _config(problem, "hang", collective_timeout_s=120.0)
    cfg["guards"] = {"hang_timeout_s": 6.0}
    proc = _run(problem, cfg, max_restarts=1, timeout=240, env={"TRAINING_RUNTIME_FAULT_STOP_AT_STEP": "1:10"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "hang: rank 0 finished no training step for" in proc.stderr and "after step 10" in proc.stderr
    assert "Thread 0x" in proc.stderr and "(most recent call first)" in proc.stderr  # faulthandler's stacks
    m = json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())
    assert m["restart_count"] == 1 and m["resumed_from_step"] == 8 and m["steps"] == 24
    first, second = m["attempts"]
    assert (first["ended"], second["ended"], second["resumed_from_step"]) == ("restarted", "completed", 8)
    assert first["reason"].startswith("hang: rank 0")
    assert [(d["detector"], d["rank"], d["attempt"]) for d in judged(m["detections"])] == [("hang", 0, 1)]


def test_a_nan_stops_the_run_once_naming_step_and_rank_and_keeps_the_last_good_checkpoint(problem):
    cfg = _config(problem, "nan", model="tests.runtime.user_model:nan_at_step", model_kwargs={"step": 10, "rank": 1})
    proc = _run(problem, cfg, max_restarts=1)
    assert proc.returncode != 0
    assert "non-finite loss at step 10 on rank 1" in proc.stderr
    (attempt,) = _attempts(cfg)  # one attempt: a restart would have left its own record
    assert attempt.deterministic and attempt.failure["rank"] == 1 and attempt.failure["step"] == 10
    outcome = launch_outcome(attempts_root(cfg["checkpoint"]["dir"]), 1)
    assert outcome.deterministic and outcome.last_good_checkpoint == "step_000000008"
    assert "ctx.report got loss=nan" in outcome.message and "last good checkpoint step_000000008 kept" in outcome.message
    assert "step_000000008" in pinned(cfg["checkpoint"]["dir"])
    assert [s for s, _ in list_checkpoints(cfg["checkpoint"]["dir"])] == [8, 4]
    assert [(d["detector"], d["step"], d["rank"]) for d in judged(attempt.detections)] == [("nonfinite", 10, 1)]


def test_a_module_that_cannot_be_imported_fails_once_naming_it(problem):
    cfg = _config(problem, "broken", train_fn="broken_team_loop:main")
    proc = _run(problem, cfg, max_restarts=1)
    assert proc.returncode != 0
    (attempt,) = _attempts(cfg)  # one attempt: a restart would have left its own record
    assert attempt.deterministic and attempt.failure["cause"] == "config"
    assert "broken_team_loop" in attempt.reason and "No module named 'team_dependency_not_installed'" in attempt.reason


def test_a_straggler_and_a_data_stall_in_a_training_function_are_named(problem):
    cfg = _config(problem, "slow")
    cfg["guards"] = {"straggler_window": 3}
    # A batch every 0.25 s: on two busy cores a step can take over 0.12 s, and the loader kept up.
    proc = _run(problem, cfg, env={"TRAINING_RUNTIME_FAULT_SLOW_RANK": "1:0.04",
                                   "TRAINING_RUNTIME_FAULT_SLOW_LOADER": "0.25"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((Path(cfg["output_dir"]) / "metrics.json").read_text())
    by_kind: dict[str, list] = {}
    for d in m["detections"]:
        by_kind.setdefault(d["detector"], []).append(d)
    assert {d["rank"] for d in by_kind["straggler"]} == {1} and "rank 1" in by_kind["straggler"][0]["message"]
    assert "recipe.loader_threads (now 1)" in by_kind["data_stall"][0]["message"], m["detections"]
    assert m["steps"] == 24  # warnings do not stop the run
