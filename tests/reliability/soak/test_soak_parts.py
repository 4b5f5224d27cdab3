"""The soak's parts on small real inputs (seconds, in make test): the fault plan and its gaps,
the Pipes message count against a real Pipes session's event log, the run verdicts, the store
and checkpoint checks on a local store holding a half-written version, shard set and checkpoint,
the inotify watch that catches a checkpoint write as it begins, the scratch volume's ballast, and
the report section."""

from __future__ import annotations

import errno
import json
import os
import random
import sys
import textwrap
import time

import dagster as dg
import torch

from resources.launch.live_telemetry import LiveTempFileMessageReader
from resources.store.local import LocalVersionedStore
from tests.reliability.soak.faults import LOCAL_CLASSES, Fault, FaultPlan, _send
from tests.reliability.soak.invariants import checkpoint_problems, commit_problems, dataset_problems
from tests.reliability.soak.runs import OK_VERDICTS, RunOutcome, _verdict, count_messages, named_causes
from tests.reliability.soak.settings import SoakSettings
from training_runtime.checkpoint.full import write_checkpoint
from training_runtime.observe.pipes import LEDGER_ENV


def test_the_plan_draws_every_class_once_a_round_and_a_seed_replays_it():
    classes = sorted(LOCAL_CLASSES)
    plan = FaultPlan(classes, random.Random(7))
    first = [plan.next() for _ in classes]
    assert sorted(first) == classes and first != classes  # every class, shuffled
    plan.owe(first[0])  # it found nothing to hit: drawn first next round
    second = [plan.next() for _ in classes]
    assert second[0] == first[0] and sorted(second) == classes
    replay = FaultPlan(classes, random.Random(7))
    assert [replay.next() for _ in classes] == first


# A rank 0 reporting through the runtime's own reporter, ledger on, under the platform's reader.
RANK0 = textwrap.dedent("""
    from training_runtime.observe.pipes import PipesReporter
    with PipesReporter() as reporter:
        reporter.info("training starts")
        reporter.custom({"kind": "telemetry", "step": 10, "loss": 1.5})
        reporter.custom({"kind": "validation", "step": 10, "validation_accuracy": 0.5})
        reporter.custom({"kind": "detection", "detector": "data_stall", "severity": "warning", "step": 20,
                         "rank": 1, "message": "rank 1 waits for batches 45% of its step time"})
        reporter.custom({"kind": "telemetry", "step": 20, "loss": 0.9})
        reporter.custom({"kind": "final", "steps": 20})
        reporter.info("wrote model.safetensors")
""")


def test_every_message_rank_0_wrote_is_found_in_the_event_log_and_a_lost_one_is_named(tmp_path):
    ledger = tmp_path / "ledger"

    @dg.asset(key=["tiny", "checkpoint"])
    def checkpoint(context):
        client = dg.PipesSubprocessClient(message_reader=LiveTempFileMessageReader(context=context),
                                          env={LEDGER_ENV: str(ledger)})
        client.run(context=context, command=[sys.executable, "-c", RANK0])
        return dg.MaterializeResult()

    with dg.instance_for_test() as instance:
        result = dg.materialize([checkpoint], instance=instance)
        assert result.success
        count = count_messages(instance, ledger, result.run_id)
        assert (count.written, count.checked, count.covered, count.unverifiable) == (7, 5, 2, 0)
        assert not count.missing and not count.skipped_lines
        # A message the rank wrote that the event log lacks (as after a reader thread died):
        (path,) = ledger.glob(f"{result.run_id}-*.jsonl")
        lines = path.read_text().splitlines()
        extra = json.loads(lines[1]) | {"seq": 8}
        path.write_text("\n".join([*lines, json.dumps(extra)]) + "\n")
        lost = count_messages(instance, ledger, result.run_id)
        assert [(m["seq"], m["kind"], m["step"]) for m in lost.missing] == [(8, "telemetry", 10)]
        # ... unless it was written after the receiving run worker was killed.
        late = count_messages(instance, ledger, result.run_id, receiver_killed_at=extra["unix"] - 5)
        assert not late.missing and late.required < late.written


def test_a_run_is_fine_when_it_succeeded_failed_by_name_or_its_retry_succeeded():
    named = "training 'digits' failed, not retried (a new attempt would fail the same way): non-finite loss at step 2"
    assert named_causes(named) == ["non-finite loss", "training failed, in the runtime's words"]
    assert named_causes("KeyError: 'step'") == []
    assert named_causes("Failure: pipeline 'digits_team': dataset 'digits' has no published versions; a version is "
                        "published when a model trained on it registers: run the digits_training job") == [
        "dataset not published yet"]
    runs = {"a": RunOutcome("a", "digits", "FAILURE", None, "a", retried_by="b"),
            "b": RunOutcome("b", "digits", "SUCCESS", "a", "a"),
            "c": RunOutcome("c", "wine", "FAILURE", None, "c", causes=named_causes(named)),
            "d": RunOutcome("d", "wine", "FAILURE", None, "d", causes=[]),
            "e": RunOutcome("e", "wine", "FAILURE", None, "e", retried_by="f"),
            "f": RunOutcome("f", "wine", "FAILURE", "e", "e", causes=[]),
            # a killed run worker (no cause of its own) whose retry then failed by name
            "g": RunOutcome("g", "digits", "FAILURE", None, "g", causes=[], retried_by="h"),
            "h": RunOutcome("h", "digits", "FAILURE", "g", "g", causes=["no space left on device"])}
    verdicts = {k: _verdict(v, runs, {}) for k, v in runs.items()}
    assert verdicts == {"a": "retry succeeded", "b": "success", "c": "named failure", "d": "unnamed failure",
                        "e": "unnamed failure", "f": "unnamed failure", "g": "retry ended in a named failure",
                        "h": "named failure"}
    assert {k for k, v in verdicts.items() if v in OK_VERDICTS} == {"a", "b", "c", "g", "h"}


def test_half_written_versions_shard_sets_and_checkpoints_are_found(tmp_path):
    store = LocalVersionedStore(tmp_path / "store", "repo")
    store.ensure_repository()
    store.create_branch("run", exist_ok=True)
    folder = "models/m/versions/v1/"
    store.put_object("run", folder + "lineage.json", json.dumps({"model": "m", "version": 1}).encode())
    store.put_object("run", folder + "model.safetensors", b"weights")
    manifest = {"splits": {"train": {"shards": [{"path": "train-0.bin", "num_bytes": 4, "sha256": "0" * 64}]}}}
    store.put_object("run", "datasets/d/shards/manifest.json", json.dumps(manifest).encode())
    half = store.commit("run", "half").id
    problems = commit_problems(store, half, {})
    assert any("without model_card.json" in p for p in problems)
    assert any("lists train-0.bin (4 bytes); the commit holds none" in p for p in problems)
    store.put_object("run", folder + "model_card.json", b"{}")
    store.put_object("run", "datasets/d/shards/train-0.bin", b"abcd")
    whole = store.commit("run", "whole").id
    assert commit_problems(store, whole, {}) == []
    store.create_tag("d-d1", whole)
    checked, problems = dataset_problems(store, "d-d1", whole)  # the right size, the wrong bytes
    assert checked == 1 and "does not match its manifest" in problems[0]

    ckpts = tmp_path / "checkpoints"
    write_checkpoint(ckpts, 1, {"step": 1, "w": torch.zeros(4)})
    write_checkpoint(ckpts, 2, {"step": 2, "w": torch.zeros(4)})
    assert checkpoint_problems(ckpts) == (2, [])
    (ckpts / "step_000000002" / "state.pt").write_bytes(b"torn")
    checked, problems = checkpoint_problems(ckpts)
    assert checked == 2 and len(problems) == 1 and "step_000000002 was listed but does not verify" in problems[0]


def _record(violations: list[dict]) -> dict:
    sample = {"at": 60.0, "processes": 9, "rss_mb_total": 2100.0, "long_lived_rss_mb": 1400.0, "disk_mb_total": 20.0}
    return {
        "started": "2026-12-01 12:00 UTC", "machine": "x86_64, 2 CPUs, Python 3.11.7", "minutes_of_load": 30,
        "load_s": 1800.0, "drain_s": 90.0, "seed": 42, "replay": "SOAK_SEED=42 SOAK_MINUTES=30 SOAK_K8S_MINUTES=10",
        "runs": {"total": 3, "by_model": {"digits": {"success": 2}, "wine": {"named failure": 1}}},
        "versions": {"digits": 2}, "commits": {"ok": 20, "failed": 1},
        "graphql": {"requests": 900, "errors": 0, "p50_ms": 30, "p95_ms": 120},
        "fault_gap_s": [15.0, 40.0],
        "faults_by_class": {"worker_kill": {"label": "fault: worker SIGKILL mid-step", "injected": 4, "not_injected": 1,
                                            "cut_short": 0},
                            "rank_hang": {"label": "guard: a rank that hangs", "injected": 0, "not_injected": 0,
                                          "cut_short": 1}},
        "invariant_rounds": 31,
        "invariants": {"runs": {"description": "every run ends in success, a named failure, or a retry that succeeded",
                                "checks": 3, "violations": len(violations)}},
        "violations": violations,
        "pipes": {"runs": 3, "written": 100, "required": 95, "checked": 80, "covered": 10, "unverifiable": 5,
                  "missing": 0},
        "footprint": [dict(sample, at=float(t)) for t in range(0, 1900, 30)],
    }


def test_the_soak_section_says_what_ran_and_a_re_run_replaces_it(tmp_path):
    import subprocess

    from tests.reliability.report import render
    from tests.reliability.soak.report_section import soak_section, splice_soak

    bad = {"invariant": "runs", "at": 600.0, "detail": "run abc (wine, FAILURE): unnamed failure: KeyError"}
    section = soak_section({"local": _record([bad])})
    assert ("**Seed** 42; replay the soak alone with `SOAK_SEED=42 SOAK_MINUTES=30 SOAK_K8S_MINUTES=10 "
            ".venv/bin/python -m pytest tests/reliability/soak/test_soak.py -m heavy`") in section
    assert "**violations: 1**" in section and "- runs at 10.0 min: run abc (wine, FAILURE)" in section
    assert "|worker_kill | fault: worker SIGKILL mid-step | 4 | 1 |" in section
    assert "4 injected, of 2 classes (**not injected: rank_hang**)" in section
    assert "found nothing to hit (drawn again): 1; cut short by the end of the load: 1." in section
    footprint = [line for line in section.splitlines() if line.startswith("|") and line.endswith(" | 20 |")]
    assert len(footprint) == 10  # the curve, spread over the soak
    # report.py's splice() re-sorts every line starting "| " as a row of its classes table
    assert not [line for line in section.splitlines() if line.startswith("| ")]
    report = render({"full": True, "classes": {}}, "make reliability") + "\n" + section
    again = splice_soak(report, soak_section({"local": _record([])}))
    assert again.count("## The soak") == 1 and "**violations: 0**" in again and "run abc" not in again

    ledger, soak, out = tmp_path / "ledger.json", tmp_path / "soak.json", tmp_path / "RELIABILITY.md"
    ledger.write_text(json.dumps({"full": True, "classes": {"fault: a": {"tried": 1, "ok": 1, "nothing_lost": 1,
                                                                       "notes": []}}}))
    soak.write_text(json.dumps({"kubernetes": _record([])}))
    subprocess.run([sys.executable, "-m", "tests.reliability.report", str(ledger), str(out), "make reliability",
                    "--soak", str(soak)], check=True, timeout=120)
    text = out.read_text()
    assert "| fault: a | 1 | 1 (100 %) |" in text and "### Kubernetes path (pod simulation)" in text


def _entries(watch, timeout_s: float = 0.5) -> list:
    seen = []
    while (entry := watch.next(timeout_s)) is not None:
        seen.append(entry)
    return seen


def test_a_checkpoint_write_is_seen_as_it_begins_in_a_folder_made_after_the_watch(tmp_path):
    from tests.reliability.soak.watch import NewEntries

    with NewEntries(tmp_path) as watch:
        ckpts = tmp_path / "digits" / "run-1" / "checkpoints"  # a new run's folder, made at once
        ckpts.mkdir(parents=True)
        assert (tmp_path, "digits") in _entries(watch)
        write_checkpoint(ckpts, 3, {"step": 3, "w": torch.zeros(4)})
        seen = _entries(watch)
    began = [name for folder, name in seen if folder == ckpts and name.startswith(".tmp-step_000000003-")]
    assert len(began) == 1 and (ckpts, "step_000000003") in seen  # created hidden, then renamed into place
    assert seen.index((ckpts, began[0])) < seen.index((ckpts, "step_000000003"))


def test_the_scratch_volume_fills_to_the_last_byte_and_is_freed(tmp_path):
    import subprocess
    import threading

    import pytest

    from tests.reliability.soak.faults import fill

    volume = tmp_path / "scratch"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(volume)], capture_output=True,
                             text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.strip()}")
    try:
        stop, taken = threading.Event(), []
        filler = threading.Thread(target=lambda: taken.append(fill(volume, 30.0, stop)))
        filler.start()
        deadline = time.monotonic() + 10
        while not (volume / ".soak-ballast").exists() or os.statvfs(volume).f_bavail:
            assert time.monotonic() < deadline, "the ballast did not fill the volume"
            time.sleep(0.05)
        with pytest.raises(OSError) as full:
            (volume / "shard-0.bin").write_bytes(b"x" * 8192)
        assert full.value.errno == errno.ENOSPC
        stop.set()
        filler.join(timeout=10)
        assert taken and taken[0] > 900 * 1024 and not (volume / ".soak-ballast").exists()
        (volume / "shard-0.bin").write_bytes(b"x" * 8192)  # room again
    finally:
        subprocess.run(["umount", "-l", str(volume)], capture_output=True, timeout=30)


def test_a_shorter_soak_has_shorter_gaps_between_faults():
    settings = SoakSettings.from_environment({"SOAK_MINUTES": "6", "SOAK_SEED": "5"})
    assert (settings.minutes, settings.k8s_minutes, settings.seed) == (6.0, 2.0, 5)
    assert settings.gap_for(30) == settings.gap_for(90) == (15.0, 40.0)
    assert settings.gap_for(6) == (3.0, 8.0) == settings.gap_for(1)  # a fifth at most
    assert settings.gap_for(15) == (7.5, 20.0)


def test_a_target_that_ended_as_it_was_picked_is_not_injected_and_says_why():
    """A training may finish between being picked and being signalled (a Kubernetes soak's
    worker_kill hit this: the injector raised ProcessLookupError and the soak counted its own error)."""
    import signal
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    fault = Fault("worker_kill", at=1.0)
    assert not _send(child.pid, signal.SIGKILL, fault) and not fault.injected
    assert fault.detail == f"the target (pid {child.pid}) ended before SIGKILL"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert _send(live.pid, signal.SIGKILL, Fault("worker_kill", at=2.0))
    assert live.wait(timeout=30) == -signal.SIGKILL


def _attempts(*sizes_at: tuple[int, float, int | None]) -> dict:
    """metrics.json's attempts and resizes for attempts of (world size, start, resumed from step)."""
    from training_runtime.distributed.elastic import resizes

    attempts = [{"world_size": w, "started_at": at, "resumed_from_step": step, "name": f"a{i}"}
                for i, (w, at, step) in enumerate(sizes_at)]
    return {"steps": 40, "attempts": attempts, "resizes": resizes(attempts)}


def test_an_elastic_gang_is_judged_on_going_on_smaller_in_the_same_run_and_growing_back():
    from tests.reliability.soak.faults import REJOIN_WITHIN_S, elastic_verdict

    done = {"total_steps": 40}
    lost = 1000.0
    grew = _attempts((2, 900.0, None), (1, 1020.0, 9), (2, 1050.0, 15))
    problem, rejoined, note = elastic_verdict("elastic_node_rejoin", "SUCCESS", grew, done, lost_at=lost,
                                              ended_at=1100.0, size=2)
    assert problem is None and rejoined
    assert note == "the gang went on at 1 from step 9, grew back to 2 from step 15; attempts at world sizes [2, 1, 2]"
    # It ended soon after the loss: going on smaller is enough, the rejoin could not happen yet.
    short = _attempts((2, 900.0, None), (1, 1020.0, 9))
    problem, rejoined, note = elastic_verdict("elastic_node_lost", "SUCCESS", short, done, lost_at=lost,
                                              ended_at=lost + 30, size=2)
    assert problem is None and not rejoined and "ended 30 s after the loss, before its replacement joined" in note
    # Trained on long after the loss without growing back: the replacement never joined.
    problem, _, _ = elastic_verdict("elastic_node_lost", "SUCCESS", short, done, lost_at=lost,
                                    ended_at=lost + REJOIN_WITHIN_S + 1, size=2)
    assert problem.startswith("the gang trained on 91 s after losing a node without growing back to 2 ranks")
    # No resize after the loss: the gang restarted at its old size (or the loss went unseen).
    same = _attempts((2, 900.0, None), (2, 1020.0, 9))
    problem, _, _ = elastic_verdict("elastic_node_lost", "SUCCESS", same, done, lost_at=lost, ended_at=1100.0,
                                    size=2)
    assert problem == "no resize below 2 ranks was recorded after the loss (attempts at world sizes [2, 2])"
    # A resize before the loss is not this loss's.
    earlier = _attempts((2, 900.0, None), (1, 950.0, 3), (2, 980.0, 6))
    assert elastic_verdict("elastic_node_lost", "SUCCESS", earlier, done, lost_at=lost, ended_at=1100.0,
                           size=2)[0].startswith("no resize below 2 ranks")
    # The run failed: a loss above min_nodes must not end the training.
    problem, _, _ = elastic_verdict("elastic_node_lost", "FAILURE", None, None, lost_at=lost, ended_at=None, size=2)
    assert problem == "the gang did not go on after losing a node above min_nodes: its run ended FAILURE"
    # Steps lost: the training stopped short of its total.
    problem, _, _ = elastic_verdict("elastic_node_lost", "SUCCESS", {**grew, "steps": 36}, done, lost_at=lost,
                                    ended_at=1100.0, size=2)
    assert problem == "the training ended at step 36 of 40"
    assert elastic_verdict("elastic_node_lost", "SUCCESS", None, done, lost_at=lost, ended_at=None,
                           size=2)[0] == "the run succeeded but its training wrote no metrics.json after the loss"


def test_soak_classes_narrow_the_draw_and_name_what_is_wrong():
    import pytest

    from tests.reliability.soak.faults import ELASTIC_CLASSES, KUBERNETES_CLASSES

    settings = SoakSettings.from_environment({"SOAK_CLASSES": "elastic_node_lost, worker_kill", "SOAK_SEED": "1"})
    assert settings.classes_for(KUBERNETES_CLASSES) == {"elastic_node_lost": ELASTIC_CLASSES["elastic_node_lost"],
                                                        "worker_kill": LOCAL_CLASSES["worker_kill"]}
    assert settings.classes_for(LOCAL_CLASSES) == {"worker_kill": LOCAL_CLASSES["worker_kill"]}
    assert SoakSettings.from_environment({"SOAK_SEED": "1"}).classes_for(KUBERNETES_CLASSES) == KUBERNETES_CLASSES
    with pytest.raises(ValueError, match="SOAK_CLASSES names unknown fault classes node_gone; the classes are"):
        SoakSettings.from_environment({"SOAK_CLASSES": "node_gone"})
    elastic_only = SoakSettings.from_environment({"SOAK_CLASSES": ",".join(ELASTIC_CLASSES), "SOAK_SEED": "1"})
    with pytest.raises(ValueError, match="names none of this launcher's classes"):
        elastic_only.classes_for(LOCAL_CLASSES)


def test_the_soak_section_names_the_elastic_classes_and_what_the_gangs_did():
    from tests.reliability.soak.faults import ELASTIC_CLASSES
    from tests.reliability.soak.report_section import soak_section

    record = _record([])
    record["faults_by_class"] = {cls: {"label": label, "injected": 1, "not_injected": 0, "cut_short": 0}
                                 for cls, label in ELASTIC_CLASSES.items()}
    record["faults"] = [
        {"cls": "elastic_node_lost", "target": {"run_status": "SUCCESS", "grew_back": True, "world_sizes": [2, 1, 2]}},
        {"cls": "elastic_node_rejoin", "target": {"run_status": "SUCCESS", "grew_back": True,
                                                  "world_sizes": [2, 1, 2]}},
        {"cls": "elastic_node_lost_in_checkpoint_write", "target": {"run_status": "SUCCESS", "grew_back": False,
                                                                    "world_sizes": [2, 1]}},
        {"cls": "worker_kill", "target": {"rank": 0}},
    ]
    section = soak_section({"kubernetes": record})
    assert "|elastic_node_lost | elastic: a node lost while above min_nodes | 1 | 0 |" in section
    assert "|elastic_node_rejoin | elastic: a lost node rejoining | 1 | 0 |" in section
    assert ("|elastic_node_lost_in_checkpoint_write | elastic: a node lost during a checkpoint write | 1 | 0 |"
            in section)
    assert ("- **Elastic gangs** (digits on 1-2 pods): 3 node losses judged; the gang went on and its run succeeded "
            "after 3, grew back to its size after 2; world sizes of the hit trainings' attempts: elastic_node_lost "
            "[2, 1, 2]; elastic_node_rejoin [2, 1, 2]; elastic_node_lost_in_checkpoint_write [2, 1].") in section
    assert "Elastic gangs" not in soak_section({"kubernetes": _record([])})


def test_telemetry_the_reader_thins_on_purpose_is_not_missing_but_a_kept_one_lost_is():
    """A training of more than 50 telemetry messages has every 2nd (then 4th ...) observed
    (resources/launch/observation_thinning.py); the soak's first elastic run (528 steps, telemetry
    every 10) counted the skipped ones as lost Pipes messages."""
    from collections import Counter

    from resources.launch.observation_thinning import ObservationThinning
    from tests.reliability.soak.runs import Arrived, match_messages

    lines = [{"seq": i + 1, "method": "custom", "kind": "telemetry", "step": 10 * (i + 1), "unix": 100.0 + i}
             for i in range(60)]
    thinning = ObservationThinning()
    kept = [e["step"] for e in lines if thinning.keep()]
    observed = Counter(str(s) for s in kept + [600])  # the last, skipped, is observed at the end
    assert 520 not in kept and 510 in kept and 530 in kept
    count = match_messages("r1", Arrived(Counter(), observed.copy(), Counter(), [], 0), {"r1-1.jsonl": lines})
    assert (count.missing, count.thinned, count.required, count.checked) == ([], 60 - len(kept) - 1, len(kept) + 1,
                                                                           len(kept) + 1)
    lost = observed.copy()
    lost["530"] -= 1
    count = match_messages("r1", Arrived(Counter(), lost, Counter(), [], 0), {"r1-1.jsonl": lines})
    assert [m["step"] for m in count.missing] == [530]
    # Across processes (an elastic gang's rank 0 moves), in the order the lines were written.
    split = {"r1-1.jsonl": lines[:30], "r1-2.jsonl": lines[30:]}
    assert match_messages("r1", Arrived(Counter(), observed.copy(), Counter(), [], 0), split).missing == []
