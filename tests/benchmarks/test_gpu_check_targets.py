"""The GPU check's verdicts (benchmarks/gpu_targets.py) on hand-written results, without a GPU:
each target is met, missed or not measured by its own figure, and an absent, failed or
non-finite figure is never met. Plus the pure helpers of benchmarks/gpu_check.py (the larger
compile batch, steady-state figures, FLOPs per token, the BENCHMARKS.md splice). Milliseconds,
no torchrun; the whole script's smoke run is test_gpu_check_smoke.py (heavy)."""

import copy
import json
from pathlib import Path

import pytest

from benchmarks import gpu_check, gpu_targets
from benchmarks.gpu_targets import MET, MISSED, NOT_MEASURED

TARGETS = 7  # MFU, FSDP (one GPU), images, tokens, checkpoint, guards, launch


def _lm(sps: float, *, mfu: float = 0.3, wait: float = 0.0, batch: int = 16, ranks: int = 1) -> dict:
    return {"kind": "lm", "ranks": ranks, "batch": batch, "samples_per_s": sps, "tokens_per_s": sps * 1024,
            "mfu": mfu, "mfu_measured_peak": mfu * 1.2, "data_wait_share": wait, "steady_data_wait_share": wait,
            "launch_to_first_step_s": 9.0, "wall_s": 20.0}


def results() -> dict:
    """A default run where every target is met, as gpu_check.py writes it."""
    return {
        "date": "2026-12-01",
        "environment": {"gpus": 1, "gpu_name": "NVIDIA H200", "driver": "580", "torch": "2.11", "cuda": "13.0",
                        "nccl": "2.28", "matmul_tflops": 790.0, "spec_tflops": 989.0},
        "model": {"params_m": 169.0, "non_embedding_m": 151.0, "layers": 12, "d_model": 1024, "seq_len": 1024},
        "throughput": {
            "ddp_bf16": _lm(290.0),
            "fsdp_bf16": _lm(284.0),
            "resnet_jpeg_bf16": {"kind": "image", "ranks": 1, "batch": 256, "samples_per_s": 9000.0,
                                 "steady_data_wait_share": 0.1, "data_wait_share": 0.1, "model": "resnet",
                                 "launch_to_first_step_s": 8.0},
            "ddp_bf16_compile": _lm(400.0, mfu=0.45),
            "ddp_bf16_compile_b64": _lm(450.0, mfu=0.52, batch=64),
        },
        "guards_cost": {"samples_per_s": {"on": [290.0, 291.0], "off": [291.5]}},
        "loader": {"tokens": {"loader_samples_per_s": 30_000.0, "batch": 16,
                              "consumers": ["ddp_bf16", "fsdp_bf16", "ddp_bf16_compile"]},
                   "images": {"loader_samples_per_s": 25_000.0, "batch": 256, "consumers": ["resnet_jpeg_bf16"],
                              "dataset": "8192 JPEGs", "decoder": "Pillow"}},
        "checkpoint": {"model": "transformer_lm d_model 2048", "params": 1.04e9, "batch": 8, "steps": 240,
                       "every_steps": 120, "saves": 2, "stall_s_total": 0.3, "train_time_s": 38.0,
                       "samples_per_s": 50.0, "mfu": 0.35, "state_gb": 12.5},
        "launch": {"run": "ddp_bf16", "gpu_s": 4.5, "cpu_s": 23.4, "cpu_date": "2026-11-30"},
        "notes": [], "not_run": {},
    }


def test_all_met_run_is_met_everywhere() -> None:
    found = gpu_targets.verdicts(results())
    assert len(found) == TARGETS
    assert [v.status for v in found] == [MET] * TARGETS, found


def test_empty_results_measure_nothing_and_meet_nothing() -> None:
    found = gpu_targets.verdicts({})
    assert len(found) == TARGETS
    assert {v.status for v in found} == {NOT_MEASURED}


# ---------------------------------------------------------------- MFU
@pytest.mark.parametrize(("mfu", "status"), [(0.45, MISSED), (0.52, MET), (0.50, MET), (0.4999, MISSED)])
def test_mfu_threshold(mfu: float, status: str) -> None:
    r = results()
    r["throughput"] = {"ddp_bf16_compile": _lm(400.0, mfu=mfu)}
    v = gpu_targets.mfu_verdict(r)
    assert v.status == status
    assert f"{mfu:.1%}" in v.measured


def test_mfu_takes_the_better_batch() -> None:
    r = results()  # batch 16: 45 %, batch 64: 52 %
    v = gpu_targets.mfu_verdict(r)
    assert v.status == MET and "52.0%" in v.measured and "ddp_bf16_compile_b64" in v.measured
    r["throughput"]["ddp_bf16_compile_b64"]["mfu"] = 0.40
    v = gpu_targets.mfu_verdict(r)
    assert v.status == MISSED and "45.0%" in v.measured


def test_mfu_ignores_runs_without_compile() -> None:
    r = results()
    r["throughput"] = {"ddp_bf16": _lm(290.0, mfu=0.9)}  # not compiled: not this target's figure
    assert gpu_targets.mfu_verdict(r).status == NOT_MEASURED


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), "52%"])
def test_mfu_that_is_not_a_number_is_not_measured(bad) -> None:
    r = results()
    r["throughput"] = {"ddp_bf16_compile": {**_lm(400.0), "mfu": bad}}
    assert gpu_targets.mfu_verdict(r).status == NOT_MEASURED


def test_failed_compile_run_says_why() -> None:
    r = results()
    r["throughput"] = {"ddp_bf16_compile": {"kind": "lm", "ranks": 1, "batch": 16, "error": "CUDA out of memory"}}
    v = gpu_targets.mfu_verdict(r)
    assert v.status == NOT_MEASURED and "CUDA out of memory" in v.measured


def test_skipped_piece_says_why() -> None:
    r = results()
    r["throughput"] = {}
    r["not_run"] = {"compile": "skipped: needs ~125 s, 40 s of the budget left"}
    v = gpu_targets.mfu_verdict(r)
    assert v.status == NOT_MEASURED and "40 s of the budget left" in v.measured


# ---------------------------------------------------------------- FSDP
@pytest.mark.parametrize(("fsdp", "status"), [(284.0, MET), (281.4, MET), (281.2, MISSED), (200.0, MISSED)])
def test_fsdp_against_ddp(fsdp: float, status: str) -> None:
    r = results()
    r["throughput"]["fsdp_bf16"]["samples_per_s"] = fsdp  # DDP: 290; 0.97x is 281.3
    (v,) = gpu_targets.fsdp_verdicts(r)
    assert v.status == status


def test_fsdp_without_its_run_is_not_measured() -> None:
    r = results()
    r["throughput"]["fsdp_bf16"] = {"kind": "lm", "ranks": 1, "batch": 16, "error": "NCCL error"}
    (v,) = gpu_targets.fsdp_verdicts(r)
    assert v.status == NOT_MEASURED and "NCCL error" in v.measured
    del r["throughput"]["ddp_bf16"]
    (v,) = gpu_targets.fsdp_verdicts(r)
    assert v.status == NOT_MEASURED


def test_fsdp_on_all_gpus_is_its_own_verdict() -> None:
    r = results()
    r["throughput"]["ddp_bf16_x8"] = _lm(2300.0, ranks=8, batch=128)
    r["throughput"]["fsdp_bf16_x8"] = _lm(2000.0, ranks=8, batch=128)
    one, eight = gpu_targets.fsdp_verdicts(r)
    assert one.status == MET and eight.status == MISSED and "8 GPUs" in eight.target


# ---------------------------------------------------------------- loaders
def test_gpu_consumption_takes_the_data_wait_out() -> None:
    assert gpu_targets.gpu_consumption({"samples_per_s": 100.0, "steady_data_wait_share": 0.5}) == 200.0
    assert gpu_targets.gpu_consumption({"samples_per_s": 100.0, "steady_data_wait_share": 0.0}) == 100.0
    assert gpu_targets.gpu_consumption({"samples_per_s": 100.0, "steady_data_wait_share": 1.0}) is None
    assert gpu_targets.gpu_consumption({"samples_per_s": 100.0}) is None


@pytest.mark.parametrize(("loader", "status"), [(20_001.0, MET), (19_999.0, MISSED), (9_000.0, MISSED)])
def test_image_loader_against_what_the_gpu_consumed(loader: float, status: str) -> None:
    r = results()  # the ResNet: 9000 samples/s with a 10 % wait: the GPU consumed 10,000/s
    r["loader"]["images"]["loader_samples_per_s"] = loader
    v = gpu_targets.loader_verdict(r, "images")
    assert v.status == status, v


def test_a_starved_gpu_is_not_mistaken_for_a_slow_one() -> None:
    r = results()
    r["throughput"]["resnet_jpeg_bf16"].update(samples_per_s=9000.0, steady_data_wait_share=0.7)
    r["loader"]["images"]["loader_samples_per_s"] = 25_000.0  # 2.8x what it trained at, 0.83x what it could take
    v = gpu_targets.loader_verdict(r, "images")
    assert v.status == MISSED and "0.83x" in v.measured


def test_token_loader_against_its_fastest_consumer() -> None:
    r = results()
    r["loader"]["tokens"]["loader_samples_per_s"] = 700.0  # 2.4x ddp_bf16, 1.75x the compiled run
    v = gpu_targets.loader_verdict(r, "tokens")
    assert v.status == MISSED and "ddp_bf16_compile" in v.measured
    del r["throughput"]["ddp_bf16_compile"]
    assert gpu_targets.loader_verdict(r, "tokens").status == MET


def test_loader_without_a_consumer_is_not_measured() -> None:
    r = results()
    r["throughput"] = {}
    assert gpu_targets.loader_verdict(r, "tokens").status == NOT_MEASURED
    r = results()
    del r["loader"]["images"]
    assert gpu_targets.loader_verdict(r, "images").status == NOT_MEASURED
    r = results()
    r["throughput"]["resnet_jpeg_bf16"] = {"kind": "image", "ranks": 1, "batch": 256, "error": "DataError: shard"}
    v = gpu_targets.loader_verdict(r, "images")
    assert v.status == NOT_MEASURED and "DataError: shard" in v.measured


# ---------------------------------------------------------------- checkpoint
@pytest.mark.parametrize(("stall", "status"), [(0.3, MET), (0.37, MET), (0.39, MISSED), (5.0, MISSED)])
def test_checkpoint_stall_share(stall: float, status: str) -> None:
    r = results()  # 38 s of training: 1 % is 0.38 s
    r["checkpoint"]["stall_s_total"] = stall
    v = gpu_targets.checkpoint_verdict(r)
    assert v.status == status, v


def test_checkpoint_says_how_often_a_save_may_come() -> None:
    r = results()
    r["checkpoint"]["stall_s_total"] = 4.0  # 2 s per save; steps of 38/240 s: 1 % needs 1,264 steps between
    v = gpu_targets.checkpoint_verdict(r)
    assert v.status == MISSED and "2.00 s per save" in v.measured and "1,264 steps" in v.measured


def test_checkpoint_of_a_small_model_is_not_measured() -> None:
    r = results()
    r["checkpoint"]["params"] = 0.9e9
    v = gpu_targets.checkpoint_verdict(r)
    assert v.status == NOT_MEASURED and "below" in v.measured


def test_failed_or_incomplete_checkpoint_run_is_not_measured() -> None:
    r = results()
    r["checkpoint"] = {"params": 1.04e9, "error": "No space left on device"}
    v = gpu_targets.checkpoint_verdict(r)
    assert v.status == NOT_MEASURED and "No space left" in v.measured
    r = results()
    del r["checkpoint"]["stall_s_total"]
    assert gpu_targets.checkpoint_verdict(r).status == NOT_MEASURED


# ---------------------------------------------------------------- guards
@pytest.mark.parametrize(("on", "off", "status"), [
    ([290.0, 291.0], [291.5], MET),      # 0.3 % cost
    ([300.0], [290.0], MET),             # on faster than off: no cost
    ([288.0, 289.0], [292.0], MISSED),   # 1.2 %
    ([], [292.0], NOT_MEASURED),
    ([290.0], [], NOT_MEASURED),
])
def test_guards_cost(on: list, off: list, status: str) -> None:
    r = results()
    r["guards_cost"] = {"samples_per_s": {"on": on, "off": off}}
    assert gpu_targets.guards_verdict(r).status == status


# ---------------------------------------------------------------- launch
@pytest.mark.parametrize(("gpu_s", "status"), [(4.5, MET), (5.0, MET), (12.0, MISSED), (None, NOT_MEASURED)])
def test_launch_against_its_target_with_the_cpu_figure_beside(gpu_s, status: str) -> None:
    r = results()
    r["launch"]["gpu_s"] = gpu_s
    v = gpu_targets.launch_verdict(r)
    assert v.status == status and "23.4 s" in v.measured


def test_launch_without_the_cpu_figure() -> None:
    r = results()
    r["launch"] = {"run": "ddp_bf16", "gpu_s": 4.0}
    v = gpu_targets.launch_verdict(r)
    assert v.status == MET and "not in benchmarks/results.json" in v.measured


def test_cpu_launch_figure_read_from_results_json(tmp_path: Path) -> None:
    assert gpu_check.cpu_launch_figure(tmp_path / "absent.json") == {}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"date": "d", "benchmarks": {"overhead": {"launch_to_first_step_s": 12.2}}}))
    assert gpu_check.cpu_launch_figure(path) == {"cpu_s": 12.2, "cpu_date": "d"}
    path.write_text(json.dumps({"date": "d", "benchmarks": {}}))
    assert gpu_check.cpu_launch_figure(path) == {}


# ---------------------------------------------------------------- the section and what is printed
def test_section_holds_every_verdict_between_its_markers(tmp_path: Path) -> None:
    r = results()
    r["throughput"]["fsdp_bf16"]["samples_per_s"] = 200.0
    found = gpu_targets.verdicts(r)
    text = gpu_targets.section(r, found)
    assert text.startswith(gpu_targets.SECTION_START) and text.rstrip().endswith(gpu_targets.SECTION_END)
    rows = [ln for ln in text.splitlines() if ln.endswith("** |") and ln.startswith("| ")]
    assert len(rows) == TARGETS
    assert sum("**missed** |" in ln for ln in rows) == 1
    assert "| ddp_bf16_compile_b64 | 1 | 64 |" in text and "resnet_jpeg_bf16 |" not in text  # LM rows only
    lines = gpu_targets.verdict_lines(found)
    assert len(lines) == TARGETS and sum(ln.lstrip().startswith("MISSED") for ln in lines) == 1

    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# B\n\nbefore\n\n{gpu_targets.SECTION_START}\nold\n{gpu_targets.SECTION_END}\n\n## After\n")
    gpu_check.write_section(text, doc)
    new = doc.read_text()
    assert new.startswith("# B\n\nbefore\n\n") and new.endswith("\n## After\n") and "\nold\n" not in new
    assert new.count(gpu_targets.SECTION_START) == 1 and "**missed**" in new


def test_section_of_a_partial_run_renders() -> None:
    r = copy.deepcopy(results())
    for key in ("checkpoint", "guards_cost", "loader", "launch"):
        del r[key]
    r["throughput"] = {"ddp_bf16": {"kind": "lm", "ranks": 1, "batch": 16, "error": "boom"}}
    r["not_run"] = {"compile": "skipped: needs ~125 s, 3 s of the budget left"}
    text = gpu_targets.section(r, gpu_targets.verdicts(r))
    assert "failed: boom" in text and "not run: compile: skipped" in text and "**met**" not in text


# ---------------------------------------------------------------- gpu_check's pure helpers
def test_larger_batch_fits_the_memory() -> None:
    # 2026-11-30: batch 16 peaked at 14.9 GB, 2.7 GB of it static, on a 143.7 GB H200
    assert gpu_check.larger_batch(16, 14.9e9, 2.7e9, 143.7e9) == 64
    assert gpu_check.larger_batch(16, 14.9e9, 2.7e9, 143.7e9, share=0.8) == 64  # at most 4x
    assert gpu_check.larger_batch(16, 14.9e9, 2.7e9, 143.7e9, share=0.8, factors=(8, 4, 2)) == 128
    assert gpu_check.larger_batch(16, 14.9e9, 2.7e9, 50e9) == 32
    assert gpu_check.larger_batch(16, 14.9e9, 2.7e9, 20e9) is None
    assert gpu_check.larger_batch(16, None, 2.7e9, 143.7e9) is None


def test_steady_reads_the_second_half_of_the_intervals() -> None:
    run = {"telemetry": [{"samples_per_second": v} for v in (10.0, 50.0, 280.0, 290.0, 300.0)]}
    assert gpu_check.steady(run, "samples_per_second") == 290.0
    assert gpu_check.steady({"telemetry": []}, "samples_per_second") is None


def test_flops_per_token_count_the_tied_head() -> None:
    # 169M LM: 151M outside the embedding, 12 layers, d_model 1024, sequence 1024, vocab 16384
    f = gpu_check.lm_flops_per_token(151_000_000, 12, 1024, 1024, 16384)
    assert f == 6 * (151_000_000 + 1024 * 16384) + 12 * 12 * 1024 * 1024
    total, _ = gpu_check.count_params(gpu_check.LM_1B, 1025, 16384)
    assert total >= 1e9  # the checkpoint target's model is at least 1B parameters


def test_pieces_that_do_not_fit_or_fail_are_recorded_and_the_rest_go_on(tmp_path: Path) -> None:
    check = gpu_check.Check.__new__(gpu_check.Check)  # the piece runner alone: no data, no runs
    check.root, check.gpus, check.failed = tmp_path, 1, []
    check.results = {"not_run": {}, "piece_s": {}}
    check.budget = gpu_check.Budget(1000)

    def boom() -> None:
        raise OSError("No space left on device")
    ran = []
    check.piece("checkpoint", boom)
    check.piece("ordinal", lambda: ran.append("ordinal"))
    assert ran == ["ordinal"] and check.failed == ["checkpoint"]
    assert check.results["not_run"] == {"checkpoint": "failed: OSError: No space left on device"}
    assert "OSError: No space left on device" in (tmp_path / "checkpoint.error.log").read_text()

    check.budget = gpu_check.Budget(60)  # the compile piece needs ~150 s
    check.piece("compile", lambda: pytest.fail("a piece that does not fit must not start"))
    assert check.results["not_run"]["compile"].startswith("skipped: needs ~150 s, 60 s of the budget left")
    v = gpu_targets.mfu_verdict({"throughput": {}, "not_run": check.results["not_run"]})
    assert v.status == NOT_MEASURED and "skipped" in v.measured
