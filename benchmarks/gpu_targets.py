"""The GPU check's targets (issue 30, item 4) and the BENCHMARKS.md section it writes, from its
results dict alone: pure functions, so they are tested on hand-written results without a GPU
(tests/benchmarks/test_gpu_check_targets.py).

Each target gives a ``Verdict(target, measured, status)``; status is ``met``, ``missed`` or
``not measured``. A figure that is absent, failed or not finite is never ``met``: the verdict says
``not measured`` and, where the results say why (a failed run, a piece skipped for time), why.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, NamedTuple

MET, MISSED, NOT_MEASURED = "met", "missed", "not measured"

MFU_MIN = 0.50  # of the datasheet's dense bf16 peak, the LM with torch.compile
FSDP_VS_DDP_MIN = 0.97  # samples/s, same model, bf16
LOADER_VS_GPU_MIN = 2.0  # the loader alone against what the GPU consumes
CHECKPOINT_STALL_MAX = 0.01  # async checkpoint stall, share of training time
CHECKPOINT_MIN_PARAMS = 1e9
GUARDS_COST_MAX = 0.01  # telemetry, TensorBoard and guards on against off
LAUNCH_MAX_S = 5.0  # launch -> first training step (row 6b's target)

SECTION_START = "<!-- gpu-check:start -->"
SECTION_END = "<!-- gpu-check:end -->"


class Verdict(NamedTuple):
    target: str
    measured: str
    status: str


def _number(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None (absent, None, NaN, a string)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _why(results: dict, piece: str, default: str) -> str:
    """Why a piece has no figure: the reason the run recorded (failed, skipped for time), or ``default``."""
    return str(results.get("not_run", {}).get(piece) or default)


def _judge(target: str, measured: str, ok: bool) -> Verdict:
    return Verdict(target, measured, MET if ok else MISSED)


def gpu_consumption(run: dict) -> float | None:
    """Samples/s the GPU consumed in a training run, its data waits taken out: steady-state
    samples/s over the steady share of step time not spent waiting for batches. A run the
    loader starved still shows what its GPU could take."""
    sps, wait = _number(run.get("samples_per_s")), _number(run.get("steady_data_wait_share"))
    if sps is None or wait is None or not 0 <= wait < 1:
        return None
    return sps / (1 - wait)


# ---------------------------------------------------------------- one function per target
def mfu_verdict(results: dict) -> Verdict:
    target = f"MFU of the LM with compile ≥ {MFU_MIN:.0%} (bf16 datasheet peak; the better batch)"
    runs = {n: r for n, r in results.get("throughput", {}).items() if n.startswith("ddp_bf16_compile")}
    scored = [(_number(r.get("mfu")), n) for n, r in runs.items()]
    scored = [(m, n) for m, n in scored if m is not None]
    if not scored:
        errors = "; ".join(f"{n}: {r['error'][:160]}" for n, r in runs.items() if r.get("error"))
        return Verdict(target, errors or _why(results, "compile", "the compile piece did not run"), NOT_MEASURED)
    best, name = max(scored)
    others = ", ".join(f"{runs[n]['batch']}: {m:.1%}" for m, n in sorted(scored, key=lambda s: s[1]) if n != name)
    return _judge(target, f"{best:.1%} ({name}, global batch {runs[name].get('batch')}"
                  + (f"; other batch {others}" if others else "") + ")", best >= MFU_MIN)


def fsdp_verdicts(results: dict) -> list[Verdict]:
    """FSDP against DDP on one GPU, and on all GPUs where those runs exist."""
    tp = results.get("throughput", {})
    pairs = [("ddp_bf16", "fsdp_bf16")] + sorted(
        (n, "fsdp" + n[3:]) for n in tp if n.startswith("ddp_bf16_x"))
    out = []
    for ddp, fsdp in pairs:
        ranks = tp.get(ddp, {}).get("ranks") or tp.get(fsdp, {}).get("ranks") or 1
        target = f"FSDP ≥ {FSDP_VS_DDP_MIN}x DDP (samples/s, bf16, {ranks} GPU{'s' if ranks != 1 else ''})"
        a, b = _number(tp.get(ddp, {}).get("samples_per_s")), _number(tp.get(fsdp, {}).get("samples_per_s"))
        if a is None or b is None or a <= 0:
            missing = [n for n, v in ((ddp, a), (fsdp, b)) if v is None]
            errs = "; ".join(f"{n}: {tp[n]['error'][:160]}" for n in missing if tp.get(n, {}).get("error"))
            why = _why(results, "throughput", f"no {' or '.join(missing)} figure (the throughput piece)")
            out.append(Verdict(target, errs or why, NOT_MEASURED))
            continue
        out.append(_judge(target, f"{b / a:.3f}x ({b:.1f} against {a:.1f} samples/s)", b / a >= FSDP_VS_DDP_MIN))
    return out


def loader_verdict(results: dict, kind: str) -> Verdict:
    """``kind``: "tokens" or "images". The loader alone (results["loader"][kind]) against the
    most any of its consumer runs (results["throughput"]) took from it."""
    what = {"tokens": "token windows", "images": "JPEG images"}[kind]
    target = f"loader ≥ {LOADER_VS_GPU_MIN:g}x what the GPU consumes ({what})"
    entry = results.get("loader", {}).get(kind)
    if not entry or _number(entry.get("loader_samples_per_s")) is None:
        why = _why(results, "loaders", f"the {kind} loader was not measured (the loaders piece)")
        return Verdict(target, why, NOT_MEASURED)
    loader = entry["loader_samples_per_s"]
    tp = results.get("throughput", {})
    taken = [(gpu_consumption(tp[n]), n) for n in entry.get("consumers", []) if n in tp]
    taken = [(c, n) for c, n in taken if c is not None and c > 0]
    if not taken:
        errors = "".join(f"; {n} failed: {tp[n]['error'][:160]}" for n in entry.get("consumers", [])
                         if tp.get(n, {}).get("error"))
        return Verdict(target, f"loader {loader:,.0f} samples/s; no training run of "
                       f"{', '.join(entry.get('consumers', [])) or 'this data'} to compare with{errors}", NOT_MEASURED)
    gpu, name = max(taken)
    return _judge(target, f"{loader / gpu:.2f}x (loader alone {loader:,.0f} samples/s at batch {entry.get('batch')}; "
                  f"{name} consumed {gpu:,.0f}/s)", loader / gpu >= LOADER_VS_GPU_MIN)


def checkpoint_verdict(results: dict) -> Verdict:
    target = (f"async checkpoint stall ≤ {CHECKPOINT_STALL_MAX:.0%} of step time "
              f"(≥ {CHECKPOINT_MIN_PARAMS / 1e9:g}B parameters)")
    c = results.get("checkpoint")
    if not c:
        return Verdict(target, _why(results, "checkpoint", "the checkpoint piece did not run"), NOT_MEASURED)
    if c.get("error"):
        return Verdict(target, f"failed: {c['error'][:200]}", NOT_MEASURED)
    params, stall, train = (_number(c.get(k)) for k in ("params", "stall_s_total", "train_time_s"))
    saves, every, steps = c.get("saves") or 0, c.get("every_steps"), c.get("steps") or 0
    if params is None or stall is None or train is None or train <= 0 or saves < 1 or steps < 1:
        return Verdict(target, "the run reported no checkpoint stall or training time", NOT_MEASURED)
    if params < CHECKPOINT_MIN_PARAMS:
        return Verdict(target, f"a model of {params / 1e6:,.3g}M parameters, below the target's "
                       f"{CHECKPOINT_MIN_PARAMS / 1e9:g}B", NOT_MEASURED)
    share, per_save, step_s = stall / train, stall / saves, train / steps
    return _judge(target, f"{share:.2%} ({per_save:.2f} s per save, {saves} saves, one every {every} steps "
                  f"= {every * step_s:.0f} s of training; {params / 1e9:.2f}B parameters; 1 % needs "
                  f"≥ {math.ceil(per_save / step_s / CHECKPOINT_STALL_MAX):,} steps between saves)",
                  share <= CHECKPOINT_STALL_MAX)


def guards_verdict(results: dict) -> Verdict:
    target = f"telemetry, TensorBoard and guards cost ≤ {GUARDS_COST_MAX:.0%} (samples/s, on against off)"
    g = results.get("guards_cost", {}).get("samples_per_s", {})
    on = [x for x in map(_number, g.get("on", [])) if x is not None]
    off = [x for x in map(_number, g.get("off", [])) if x is not None]
    if not on or not off or min(off) <= 0:
        return Verdict(target, _why(results, "guards", "no on/off pair of runs (the guards piece)"), NOT_MEASURED)
    ratio = statistics.median(on) / statistics.median(off)
    cost = 1 - ratio
    return _judge(target, f"{cost:+.1%} ({ratio:.3f}x; on {', '.join(f'{x:.1f}' for x in on)}, off "
                  f"{', '.join(f'{x:.1f}' for x in off)} samples/s)", cost <= GUARDS_COST_MAX)


def launch_verdict(results: dict) -> Verdict:
    target = f"launch → first training step ≤ {LAUNCH_MAX_S:g} s (torchrun on the GPU; CPU row 6b beside it)"
    launch = results.get("launch", {})
    gpu, cpu = _number(launch.get("gpu_s")), _number(launch.get("cpu_s"))
    cpu_text = (f"CPU row 6b (the Dagster run, {launch.get('cpu_date', '?')}): {cpu:.1f} s" if cpu is not None
                else "CPU row 6b: not in benchmarks/results.json")
    if gpu is None:
        return Verdict(target, f"{_why(results, 'throughput', 'not measured on the GPU')}; {cpu_text}", NOT_MEASURED)
    return _judge(target, f"{gpu:.1f} s ({launch.get('run')}); {cpu_text}", gpu <= LAUNCH_MAX_S)


def verdicts(results: dict) -> list[Verdict]:
    """Every target of the GPU check, in the issue's order."""
    return [mfu_verdict(results), *fsdp_verdicts(results), loader_verdict(results, "images"),
            loader_verdict(results, "tokens"), checkpoint_verdict(results), guards_verdict(results),
            launch_verdict(results)]


# ---------------------------------------------------------------- the BENCHMARKS.md section
def _env_line(results: dict) -> str:
    env = results["environment"]
    return (f"Measured {results['date']} on {env['gpus']} x {env['gpu_name']} (driver {env['driver']}, torch "
            f"{env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}); bf16 matmul 8192^3: "
            f"{env['matmul_tflops']:.0f} TFLOP/s measured, {env['spec_tflops']} on the datasheet. All runs in "
            f"one invocation ({results.get('wall_s', 0):.0f} s), side by side.")


def _lm_table(results: dict) -> list[str]:
    m = results["model"]
    lines = [(f"Language model: transformer_lm, {m['params_m']:.0f}M parameters ({m['non_embedding_m']:.0f}M "
             f"outside the embedding), {m['layers']} layers, d_model {m['d_model']}, sequence {m['seq_len']}. "
             "Samples/s is the median of the second half of the telemetry intervals. MFU counts 6 FLOPs per "
             "token per weight outside the embedding, the tied output head's d_model x vocab included (figures "
             "before 2026-12-01 left the head out and read about 10 % low), plus attention's, against the "
             "datasheet peak (and, in brackets, the measured matmul rate). Launch is torchrun's start to the "
             "trainer's first step."), "",
             ("| run | ranks | global batch | samples/s | tokens/s | MFU | data-wait share | launch → first step "
             "| ratio to DDP bf16 |"), "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    tp = results.get("throughput", {})
    base = _number(tp.get("ddp_bf16", {}).get("samples_per_s"))
    for name, r in tp.items():
        if r.get("kind", "lm") != "lm":
            continue
        if _number(r.get("samples_per_s")) is None:
            lines.append(f"| {name} | {r.get('ranks', '')} | {r.get('batch', '')} | failed: "
                         f"{str(r.get('error', ''))[:120]} | | | | | |")
            continue
        ratio = f"{r['samples_per_s'] / base:.2f}x" if base else ""
        launch = _number(r.get("launch_to_first_step_s"))
        lines.append(f"| {name} | {r['ranks']} | {r['batch']} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:,.0f} "
                     f"| {r['mfu']:.1%} ({r['mfu_measured_peak']:.1%}) | {r['data_wait_share']:.3f} | "
                     f"{'' if launch is None else f'{launch:.1f} s'} | {ratio} |")
    return lines


def _details(results: dict) -> list[str]:
    lines = []
    img = results.get("loader", {}).get("images", {})
    run = results.get("throughput", {}).get("resnet_jpeg_bf16", {})
    if img.get("dataset") and _number(run.get("samples_per_s")) is not None:
        wait = _number(run.get("steady_data_wait_share"))
        lines += ["", (f"Images: {img['dataset']}; {run['model']} trained at {run['samples_per_s']:,.0f} samples/s "
                      f"(steady data-wait share {'?' if wait is None else f'{wait:.3f}'}); JPEGs decoded by "
                      f"{img['decoder']}.")]
    c = results.get("checkpoint", {})
    if _number(c.get("params")) is not None and not c.get("error"):
        lines += ["", (f"Checkpoint run: {c['model']}, {c['params'] / 1e9:.2f}B parameters, {c['steps']} steps of "
                      f"global batch {c['batch']} ({c['samples_per_s']:.1f} samples/s, MFU {c['mfu']:.1%}), async "
                      f"full checkpoints every {c['every_steps']} steps ({c['state_gb']:.1f} GB of model and AdamW "
                      f"state each); stall as the trainer reports it (checkpoint_stall_s_total) against its "
                      f"training time ({c['train_time_s']:.1f} s).")]
    nv = results.get("nvml", {})
    if nv:
        lines += ["", "NVML figures from the DDP bf16 run's telemetry (last interval): "
                  + ", ".join(f"{k} {v}" for k, v in nv.items()) + "."]
    d = results.get("determinism", {})
    if d:
        lines += ["", (f"Determinism (`train.deterministic`, {d['model']}, {d['steps']} steps): two uninterrupted "
                      f"runs identical: **{d['uninterrupted_identical']}**; killed at step {d['kill_step']} and "
                      f"resumed from step {d.get('resumed_from_step')}: identical to the uninterrupted run: "
                      f"**{d['resumed_identical']}** (largest difference {d['resumed_max_abs_diff']:.3g}).")]
    o = results.get("ordinal_check", {})
    if o:
        lines += ["", (f"More ranks than GPUs ({o['ranks']} ranks, {o['gpus']} GPU): refused: **{o['refused']}** — "
                      f"`{o['message']}`")]
    return lines


def section(results: dict, found: list[Verdict]) -> str:
    """The "GPU check" section of BENCHMARKS.md, between its markers."""
    lines = [SECTION_START, "## GPU check (`bash benchmarks/gpu_check.sh`)", "", _env_line(results), "",
             "| target | measured | verdict |", "| --- | --- | --- |"]
    lines += [f"| {v.target} | {v.measured} | **{v.status}** |" for v in found]
    if any(r.get("kind", "lm") == "lm" for r in results.get("throughput", {}).values()):
        lines += [""] + _lm_table(results)
    lines += _details(results)
    notes = list(results.get("notes", [])) + [f"not run: {k}: {v}" for k, v in results.get("not_run", {}).items()]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def verdict_lines(found: list[Verdict]) -> list[str]:
    """What the script prints: one line per target, its verdict first."""
    return [f"{v.status.upper():>12}  {v.target}: {v.measured}" for v in found]
