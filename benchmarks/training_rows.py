"""The training rows of the benchmark table (figures 4, 5, 5b and 5c): checkpoint saves against
torch.save, 2 gloo ranks against 1, the cost of telemetry and guards, and FSDP's per-rank peak
memory against DDP for a user's own model (benchmarks/fsdp_memory.py). ``RUNNERS`` measure;
``render`` turns results.json's entries into rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import REPO, ProbeError, median, rotate
from benchmarks.harness import Ctx, Rows, fmt, measured

# ---------------------------------------------------------------- 4. checkpointing
def bench_checkpoint(ctx: Ctx) -> dict:
    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="ckpt-") as tmp:
        r = ctx.probe("checkpoint", {"dir": tmp, "hidden": ctx.p["ckpt_hidden"], "layers": 2,
                                     "reps": ctx.p["ckpt_reps"]})
    t = {k: median(v) for k, v in r["times"].items()}
    return {"state_bytes": r["state_bytes"], "median_s": t, "times": r["times"],
            "checkpoint_loads": r["checkpoint_loads"], "async_checkpoint_loads": r["async_checkpoint_loads"],
            "sync_vs_torch_save": t["torch_save"] / t["sync_stall"],
            "durable_vs_torch_save_fsync": t["torch_save_fsync"] / t["sync_durable"],
            "torch_save_fsync_vs_torch_save": t["torch_save"] / t["torch_save_fsync"],
            "async_stall_vs_sync": t["async_stall"] / t["sync_stall"],
            "async_copy_stall_vs_sync": t["async_copy_stall"] / t["sync_stall"],
            "async_step_vs_train_step": t["async_step"] / t["train_step"]}


# ---------------------------------------------------------------- 5. scaling
def bench_scaling(ctx: Ctx) -> dict:
    """1 rank, 2 DDP ranks, and the machine's own ceiling: two independent 1-rank runs at once
    (no communication), which shows how much of the loss is the cores and how much is DDP."""
    import threading

    from benchmarks import datagen, training

    data = ctx.data / f"train_256_{ctx.size}"
    man = datagen.shard_dataset(data, rows=ctx.p["scale_rows"], dim=256, samples_per_shard=4096)
    per_rank = 256
    runs: dict[str, list[dict]] = {"1": [], "2": [], "2_independent": []}

    def one(work: Path, nproc: int) -> dict:
        cfg = training.runtime_config(data, man, work, global_batch=per_rank * nproc, max_steps=ctx.p["scale_steps"])
        m = training.torchrun(cfg, work, nproc, timeout=ctx.p["timeout"])
        step = max(m["per_rank_step_time_s"])
        return {"samples_per_s": per_rank * nproc / step, "step_s": step,
                "per_rank_step_time_s": m["per_rank_step_time_s"], "data_wait_share": m["data_wait_share"],
                "steps": m["steps"]}

    def pair(work: Path) -> dict:
        out: dict[int, dict] = {}
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                out[i] = one(work / f"p{i}", 1)
            except BaseException as e:  # re-raised below, on the benchmark's thread
                errors.append(e)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return {"samples_per_s": sum(r["samples_per_s"] for r in out.values()),
                "step_s": [out[i]["step_s"] for i in range(2)]}

    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="scale-") as tmp:
        for rep in range(ctx.p["reps"]):
            for which in rotate(list(runs), rep):
                work = Path(tmp) / which
                runs[which].append(pair(work) if which == "2_independent" else one(work, int(which)))
    sps = {n: median([r["samples_per_s"] for r in v]) for n, v in runs.items()}
    return {"model": training.MODEL, "features": 256, "per_rank_batch": per_rank, "threads_per_rank": 1,
            "median_samples_per_s": sps, "efficiency": sps["2"] / (2 * sps["1"]),
            "independent_efficiency": sps["2_independent"] / (2 * sps["1"]), "runs": runs}


# ---------------------------------------------------------------- 5b. telemetry and guards
def bench_guards(ctx: Ctx) -> dict:
    """The same 2-rank training with telemetry and guards on (the defaults: telemetry every 10 steps,
    every guard, the hang watchdog) and off (guards.enabled false, telemetry every 10^6 steps),
    alternated side by side; the figure is the ratio of their step times. Beside it, the guards'
    own per-step work timed alone (probe guard_step), which the end-to-end ratio cannot resolve
    from the run-to-run noise of two ranks sharing two cores."""
    from benchmarks import datagen, training

    data = ctx.data / f"train_256_{ctx.size}"
    man = datagen.shard_dataset(data, rows=ctx.p["scale_rows"], dim=256, samples_per_shard=4096)
    per_rank, nproc = 256, 2
    runs: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="guards-") as tmp:
        for rep in range(ctx.p["guards_reps"]):
            for which in rotate(list(runs), rep):
                cfg = training.runtime_config(data, man, Path(tmp) / which, global_batch=per_rank * nproc,
                                              max_steps=ctx.p["guards_steps"])
                if which == "off":
                    cfg["guards"] = {"enabled": False}
                    cfg["telemetry"] = {"every_steps": 10**6, "tensorboard": False}
                m = training.torchrun(cfg, Path(tmp) / which, nproc, timeout=ctx.p["timeout"])
                runs[which].append(max(m["per_rank_step_time_s"]))
        alone = ctx.probe("guard_step", {"data": str(data), "work": str(Path(tmp) / "probe"), "batch": per_rank,
                                         "steps": ctx.p["guard_step_steps"], "reps": ctx.p["guards_reps"]})
    step = {k: median(v) for k, v in runs.items()}
    guard_s, whole_s = median(alone["guard_s"]), median(alone["step_s"])
    return {"model": training.MODEL, "per_rank_batch": per_rank, "ranks": nproc, "steps": ctx.p["guards_steps"],
            "median_step_s": step, "cost": step["on"] / step["off"] - 1.0, "runs": runs,
            "off_spread": max(runs["off"]) / min(runs["off"]) - 1.0,
            "guard_step": {"guard_s": guard_s, "step_s": whole_s, "share": guard_s / whole_s, "runs": alone}}


# ---------------------------------------------------------------- 5c. FSDP memory of a user's model
FSDP_MODES = ("ddp", "fsdp", "fsdp_ac")
# glibc keeps freed blocks below its (self-raising, up to 32 MB) mmap threshold in the heap, so
# RSS would hold on to buffers FSDP has already freed; fixed at 1 MB, in all three modes alike,
# freed buffers leave RSS and the peak is what was live.
FSDP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20), "OMP_NUM_THREADS": "1"}


def _fsdp_run(ctx: Ctx, mode: str, out: Path) -> dict:
    """One torchrun of benchmarks/fsdp_memory.py on 2 gloo ranks; its JSON (every rank's figures)."""
    m = ctx.p["fsdp"]
    cmd = [ctx.py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "benchmarks.fsdp_memory", "--mode", mode, "--out", str(out), "--d-model", str(m["d_model"]),
           "--layers", str(m["layers"]), "--vocab", str(m["vocab"]), "--heads", str(m["heads"]),
           "--batch", str(m["batch"]), "--seq", str(m["seq"]), "--steps", str(m["steps"]), "--units", m["units"]]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **FSDP_ENV}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.p["timeout"], env=env, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        raise ProbeError(f"{' '.join(cmd)} ran past {ctx.p['timeout']} s") from e
    if p.returncode != 0 or not out.exists():
        # the ranks' own exceptions, which torchrun's summary at the end of stderr leaves out
        causes = sorted({ln for ln in p.stderr.splitlines() if re.match(r"\[rank\d+\]: \w+(Error|Exception)", ln)})
        raise ProbeError(f"{' '.join(cmd)} exited {p.returncode}: {' '.join(causes)[:1500]} "
                         f"{(p.stderr or p.stdout)[-800:]}")
    return json.loads(out.read_text())


def bench_fsdp_memory(ctx: Ctx) -> dict:
    """Per-rank peak RSS of the same user model and steps under DDP, FSDP (size-based units) and
    FSDP with activation checkpointing per unit; each mode once, in turn (a run of the full-size
    model takes minutes on these cores)."""
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="fsdp-") as tmp:
        for mode in FSDP_MODES:
            runs[mode] = _fsdp_run(ctx, mode, Path(tmp) / f"{mode}.json")
    peak = {k: max(r["peak_rss_bytes"] for r in v["ranks"]) for k, v in runs.items()}
    step = {k: max(median(r["step_s"]) for r in v["ranks"]) for k, v in runs.items()}
    return {"parameters": runs["ddp"]["parameters"], "model": ctx.p["fsdp"], "ranks": runs["ddp"]["world_size"],
            "units": runs["fsdp"]["units"], "env": FSDP_ENV, "peak_rss_bytes": peak, "step_s": step,
            "fsdp_vs_ddp": peak["fsdp"] / peak["ddp"], "fsdp_ac_vs_ddp": peak["fsdp_ac"] / peak["ddp"],
            "step_fsdp_vs_ddp": step["fsdp"] / step["ddp"], "step_fsdp_ac_vs_ddp": step["fsdp_ac"] / step["ddp"],
            "python": sys.version.split()[0], "runs": runs}


# ---------------------------------------------------------------- 5e. FSDP as a user runs it
def bench_fsdp_train(ctx: Ctx) -> dict:
    """DDP, then FSDP, each one ``python -m pipelines train`` of a team's own transformer from a
    code location outside the repository (benchmarks/fsdp_train.py): the workers' per-rank peak
    RSS (the kernel's VmHWM: the saves included) with no allocator setting of the user's own."""
    m = ctx.p["fsdp_train"]
    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="fsdp-train-") as tmp:
        out = Path(tmp) / "fsdp_train.json"
        cmd = [ctx.py, "-m", "benchmarks.fsdp_train", "--out", str(out), "--work", tmp,
               "--d-model", str(m["d_model"]), "--layers", str(m["layers"]), "--heads", str(m["heads"]),
               "--seq", str(m["seq"]), "--batch", str(m["batch"]), "--chars", str(m["chars"]),
               "--timeout", str(ctx.p["timeout"] * 2)]
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
        env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.p["timeout"] * 5, env=env, cwd=REPO)
        except subprocess.TimeoutExpired as e:
            raise ProbeError(f"{' '.join(cmd)} ran past {ctx.p['timeout'] * 5} s") from e
        if p.returncode != 0 or not out.exists():
            raise ProbeError(f"{' '.join(cmd)} exited {p.returncode}: {(p.stderr or p.stdout)[-2500:]}")
        r = json.loads(out.read_text())
    runs = r["runs"]
    peak = {k: v["peak_rss_bytes"] for k, v in runs.items()}
    save = {k: max(x["save_rss_bytes"] for x in v["ranks"].values()) for k, v in runs.items()}
    steps = {k: max(x["steps_rss_bytes"] for x in v["ranks"].values()) for k, v in runs.items()}
    step = {k: v["step_time_s"] for k, v in runs.items()}
    return {"model": r["model"], "runs": runs, "peak_rss_bytes": peak, "save_rss_bytes": save, "steps_rss_bytes": steps,
            "fsdp_vs_ddp": peak["fsdp"] / peak["ddp"],
            "step_fsdp_vs_ddp": step["fsdp"] / step["ddp"] if step["fsdp"] and step["ddp"] else None,
            "python": sys.version.split()[0]}


def _render_fsdp_train(s: dict, rows: Rows) -> None:
    mb, m, runs = s["peak_rss_bytes"], s["model"], s["runs"]
    f, d = runs["fsdp"], runs["ddp"]
    wrapping = (f.get("wrapping") or {})
    side = (f"peak RSS per rank (VmHWM, saves included): DDP {mb['ddp'] / 2**20:,.0f} MB, FSDP "
            f"{mb['fsdp'] / 2**20:,.0f} MB; sampled in the steps DDP {s['steps_rss_bytes']['ddp'] / 2**20:,.0f} / FSDP "
            f"{s['steps_rss_bytes']['fsdp'] / 2**20:,.0f} MB, in the saves (best weights, checkpoint, model) DDP "
            f"{s['save_rss_bytes']['ddp'] / 2**20:,.0f} / FSDP {s['save_rss_bytes']['fsdp'] / 2**20:,.0f} MB; "
            f"{'FSDP units ' + str(wrapping['units']) + ' (' + wrapping['unit_policy'] + '); ' if 'units' in wrapping else ''}"
            f"step {fmt(s['step_fsdp_vs_ddp'])}× DDP's; FSDP checkpoint {f['checkpoints']['bytes'] / 2**20:,.0f} MB "
            f"+ best weights {f['checkpoints']['best_bytes'] / 2**20:,.0f} MB for a "
            f"{(f['model_bytes'] or 0) / 2**20:,.0f} MB model; workers' MALLOC_MMAP_THRESHOLD_ from the launcher")
    rows.add(f"5e. FSDP per-rank peak memory vs DDP through `python -m pipelines train`: a team's transformer "
             f"({m['layers']} blocks of its own class, d_model {m['d_model']}) from a location outside the repo, "
             f"2 gloo ranks, {m['batch_per_rank']}×{m['seq']} tokens/rank, final save included",
             f"{fmt(s['fsdp_vs_ddp'])}× DDP", side, "≤ 0.6× DDP", s["fsdp_vs_ddp"] <= 0.6, how="each sharding once, in turn")


# ---------------------------------------------------------------- rows
def render(b: dict, rows: Rows) -> None:
    """Rows 4a, 4b, 5, 5b and 5c of ``b`` (results.json's ``benchmarks``)."""
    if measured(b.get("checkpoint")):
        s = b["checkpoint"]
        t = s["median_s"]
        rows.add(f"4a. checkpoint, sync save ({s['state_bytes'] / 2**20:.0f} MB state)",
                 f"{fmt(s['sync_vs_torch_save'])}× torch.save speed",
                 f"torch.save {t['torch_save']:.3f} s; sync-mode save (training blocked until published; fsync "
                 f"and pruning in the background) {t['sync_stall']:.3f} s; write_checkpoint fsynced before it "
                 f"returns {t['sync_durable']:.3f} s ({fmt(s['durable_vs_torch_save_fsync'])}× torch.save + fsync "
                 f"{t['torch_save_fsync']:.3f} s)", "≥ 0.8×", s["sync_vs_torch_save"] >= 0.8)
        rows.add("4b. checkpoint, async training stall", f"{fmt(s['async_stall_vs_sync'], '{:.3f}')}× sync stall",
                 f"async {t['async_stall']:.4f} s (the save {t['async_stall'] - t['async_wait']:.4f} s, then the next "
                 f"optimizer step's wait for the parameters' and moments' copy {t['async_wait']:.4f} s); sync "
                 f"{t['sync_stall']:.3f} s; one writer per mode across saves, as in training. The training step "
                 f"after the save ({t['train_step']:.3f} s alone, batch 256, on both cores) took "
                 f"{fmt(s['async_step_vs_train_step'], '{:.2f}')}× as long, save included, beside the writer's "
                 f"copy and its torch.save, sha256 and fsync on the same cores; the whole copy inside "
                 f"the save, as without the optimizer, {t['async_copy_stall']:.4f} s "
                 f"({fmt(s['async_copy_stall_vs_sync'], '{:.3f}')}× sync)", "≤ 0.1×", s["async_stall_vs_sync"] <= 0.1)
    if measured(b.get("scaling")):
        s = b["scaling"]
        m = s["median_samples_per_s"]
        share = s["efficiency"] / s["independent_efficiency"]
        rows.add("5. scaling, 2 gloo ranks vs 1 (MLP 256→1024→1024→10, 256/rank, 1 thread/rank)",
                 f"efficiency {fmt(s['efficiency'])}, {fmt(share)} of the cores' own ceiling",
                 f"1 rank {fmt(m['1'], '{:,.0f}')}/s; 2 ranks {fmt(m['2'], '{:,.0f}')}/s; the cores' own ceiling, "
                 f"two independent 1-rank runs at once: {fmt(m.get('2_independent'), '{:,.0f}')}/s (efficiency "
                 f"{fmt(s.get('independent_efficiency'))})", "≥ 0.9 of the ceiling", share >= 0.9)
    if measured(b.get("guards")):
        s = b["guards"]
        alone = s.get("guard_step")  # older results have no probe
        beside = "" if alone is None else (
            f"; the guards' own per-step work alone (gradient norm, non-finite counts on the device) "
            f"{alone['guard_s'] * 1000:.2f} ms, {alone['share']:.1%} of a one-rank step of {alone['step_s'] * 1000:.1f} ms")
        spread = "" if "off_spread" not in s else f"; the off runs spread {s['off_spread']:.0%}"
        rows.add("5b. telemetry and guards, on vs off (2 gloo ranks, MLP 256→1024→1024→10, 256/rank)",
                 f"{s['cost']:+.1%} step time", f"step {s['median_step_s']['on'] * 1000:.2f} ms on, "
                 f"{s['median_step_s']['off'] * 1000:.2f} ms off (median of {len(s['runs']['on'])} runs"
                 f"{' of ' + str(s['steps']) + ' steps' if 'steps' in s else ''} each, alternated){spread}{beside}",
                 "≤ +2 %", s["cost"] <= 0.02)
    if measured(b.get("fsdp_memory")):
        s = b["fsdp_memory"]
        mb, st, m = s["peak_rss_bytes"], s["step_s"], s["model"]
        millions = s["parameters"] / 1e6
        model = (f"{millions:.{0 if millions >= 10 else 1}f}M-parameter user transformer ({m['layers']} blocks of its "
                 f"own class, d_model {m['d_model']}), {s['ranks']} gloo ranks, AdamW, {m['batch']}×{m['seq']} tokens/rank")
        side = (f"peak RSS per rank: DDP {mb['ddp'] / 2**20:,.0f} MB, FSDP {mb['fsdp'] / 2**20:,.0f} MB "
                f"({s['units']} units, {m['units'] or 'by size'}), FSDP + checkpointing {mb['fsdp_ac'] / 2**20:,.0f} MB; "
                f"step "
                f"{st['ddp']:.2f} / {st['fsdp']:.2f} / {st['fsdp_ac']:.2f} s ({fmt(s['step_fsdp_vs_ddp'])}× and "
                f"{fmt(s['step_fsdp_ac_vs_ddp'])}× DDP's); MALLOC_MMAP_THRESHOLD_={s['env']['MALLOC_MMAP_THRESHOLD_']}")
        how = "each mode once, in turn"
        rows.add(f"5c. FSDP per-rank peak memory vs DDP, {model}", f"{fmt(s['fsdp_vs_ddp'])}× DDP", side,
                 "≤ 0.6× DDP", s["fsdp_vs_ddp"] <= 0.6, how=how)
        rows.add("5d. … with activation checkpointing per unit", f"{fmt(s['fsdp_ac_vs_ddp'])}× DDP; step time "
                 f"{fmt(s['step_fsdp_ac_vs_ddp'])}× DDP's", "(as 5c)", "≤ 0.4× DDP", s["fsdp_ac_vs_ddp"] <= 0.4,
                 how=how)
    if measured(b.get("fsdp_train")):
        _render_fsdp_train(b["fsdp_train"], rows)


RUNNERS = {"checkpoint": bench_checkpoint, "scaling": bench_scaling, "guards": bench_guards,
           "fsdp_memory": bench_fsdp_memory, "fsdp_train": bench_fsdp_train}
