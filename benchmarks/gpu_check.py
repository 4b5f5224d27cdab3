"""The GPU check: what only a GPU machine can show, in one run of a few minutes.

    bash benchmarks/gpu_check.sh            # on a machine with NVIDIA GPUs and torch with CUDA

It trains through the real entry point (``torchrun -m training_runtime``) on generated data:
- a transformer language model (~170M parameters) under DDP with bf16 autocast, FSDP2 with its
  bf16 MixedPrecisionPolicy, fp32 with and without TF32, and torch.compile, on one GPU and on
  all GPUs when there are several: steady-state samples/s, tokens/s and MFU, the data-wait
  share with the loader feeding the GPU, NVML figures from the telemetry;
- telemetry every step against every 10 steps (what the per-interval exchange costs);
- determinism: two uninterrupted runs and one killed mid-run and resumed by torchrun, with
  ``train.deterministic``, compared bit for bit;
- the ordinal check: more ranks than GPUs is refused with the runtime's message.

It writes ``gpu_check.json`` and replaces the "GPU check" section of BENCHMARKS.md (also copied
to $OUT when set). It needs only torch, numpy, psutil, nvidia-ml-py, safetensors and
torchmetrics: no Dagster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training_runtime.data.shard_format import FORMAT_V2, Column, ShardWriter  # noqa: E402

SECTION_START = "<!-- gpu-check:start -->"
SECTION_END = "<!-- gpu-check:end -->"
# Dense bf16 tensor-core peaks from NVIDIA's datasheets (SXM parts, no sparsity), TFLOP/s.
SPEC_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}


# ---------------------------------------------------------------- data
def token_dataset(root: Path, *, n_train: int, n_eval: int, seq_len: int, vocab: int, seed: int = 0):
    """Windows of seq_len + 1 tokens of a noisy counting sequence (learnable: next = previous + 1
    nine times out of ten), as v2 shards written by the runtime's own writer."""
    rng = np.random.default_rng(seed)
    columns = [Column("tokens", "ndarray", "input", "uint16", (seq_len + 1,)), Column("id", "str", "id")]
    writer, splits, locations = ShardWriter(columns), {}, {}
    for split, n in (("train", n_train), ("validation", n_eval), ("test", n_eval)):
        start = rng.integers(0, vocab, n)
        steps = np.where(rng.random((n, seq_len)) < 0.9, 1, rng.integers(0, vocab, (n, seq_len)))
        tokens = (start[:, None] + np.concatenate([np.zeros((n, 1), int), np.cumsum(steps, axis=1)], axis=1)) % vocab
        entries = []
        per_shard = 512
        for i, lo in enumerate(range(0, n, per_shard)):
            rel = f"shards/{split}/{i:05d}.bin"
            part = {"tokens": tokens[lo:lo + per_shard].astype(np.uint16),
                    "id": [f"{split}-{j}" for j in range(lo, min(n, lo + per_shard))]}
            entries.append(writer.write(root / rel, rel, part))
            locations[rel] = (root / rel).as_uri()
        splits[split] = {"num_samples": n, "shards": entries}
    manifest = {"format": FORMAT_V2, "columns": [c.to_dict() for c in columns], "splits": splits, "kind": "text",
                "task": "language_modeling",
                "tokenizer": {"kind": "generated", "vocab_size": vocab, "eos_id": None, "pad_id": None}}
    return manifest, locations


# ---------------------------------------------------------------- runs
DEVICE = "cuda"  # --smoke: "cpu"


def lm_config(root: Path, name: str, data, *, model_kwargs: dict, batch: int, steps: int, **train) -> dict:
    manifest, locations = data
    ckpt_every = train.pop("checkpoint_every", 10_000)
    telemetry_every = train.pop("telemetry_every", 10)
    return {
        "model": {"name": "transformer_lm", "kwargs": model_kwargs},
        "data": {"commit_id": "gpu-check", "manifest": manifest, "locations": locations},
        "task": "language_modeling",
        "train": {"epochs": 1000, "max_steps": steps, "batch_size": batch, "lr": 3e-4, "optimizer": "adamw",
                  "lr_schedule": "constant", "seed": 0, "device": DEVICE, "num_workers": 2, "prefetch_batches": 4,
                  **train},
        "validation": {"enabled": False},
        "checkpoint": {"dir": str(root / name / "ckpt"), "every_steps": ckpt_every, "keep_last": 2},
        "output_dir": str(root / name / "out"),
        "telemetry": {"every_steps": telemetry_every},
    }


def torchrun(root: Path, name: str, config: dict, *, nproc: int, env: dict | None = None, max_restarts: int = 0,
             timeout: float = 300) -> dict:
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "-m", "training_runtime", "--config", str(path)]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    (root / f"{name}.log").write_text(proc.stderr)
    out = {"name": name, "returncode": proc.returncode, "wall_s": round(wall, 1)}
    if proc.returncode != 0:
        out["error_tail"] = proc.stderr[-3000:]
        return out
    out["metrics"] = json.loads((Path(config["output_dir"]) / "metrics.json").read_text())
    out["telemetry"] = [json.loads(m.group(1)) for m in re.finditer(r" telemetry (\{.*\})$", proc.stderr, re.M)]
    return out


def steady_samples_per_s(run: dict) -> float | None:
    """Median samples/s over the second half of the telemetry intervals (compilation, warm-up and
    the allocator's first growth stay out)."""
    sps = [t["samples_per_second"] for t in run.get("telemetry", [])]
    return statistics.median(sps[len(sps) // 2:]) if sps else None


def lm_flops_per_token(n_params_non_embedding: int, layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weights' matmuls (forward and backward) plus causal
    attention's 6 * layers * seq_len * d_model (PaLM's appendix B, halved for the causal mask's
    skipped half is NOT assumed: kernels compute it, MFU counts useful work, so the full term)."""
    return 6 * n_params_non_embedding + 12 * layers * seq_len * d_model


def count_params(model_kwargs: dict, seq_len: int, vocab: int) -> tuple[int, int]:
    from training_runtime.models.builtin import TransformerLM

    with torch.device("meta"):
        m = TransformerLM([seq_len], vocab, **model_kwargs)
    total = sum(p.numel() for p in m.parameters())
    embed = sum(p.numel() for n, p in m.named_parameters() if "embed" in n or "pos" in n)
    return total, total - embed


def matmul_peak_tflops() -> float:
    """Achievable bf16 matmul rate on this GPU (8192^3, mean of 10 after 3 warm-ups)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    end.synchronize()
    return 2 * 8192 ** 3 * 10 / (start.elapsed_time(end) / 1000) / 1e12


def weights_equal(a: Path, b: Path) -> tuple[bool, float]:
    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    same = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    diff = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    return same, diff


# ---------------------------------------------------------------- report
def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [SECTION_START, "## GPU check (`bash benchmarks/gpu_check.sh`)", "",
             f"Measured {results['date']} on {env['gpus']} x {env['gpu_name']} "
             f"(driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}); "
             f"bf16 matmul 8192^3: {env['matmul_tflops']:.0f} TFLOP/s measured, {env['spec_tflops']} on the datasheet. "
             "All runs in one invocation, side by side.", "",
             f"Language model: transformer_lm, {results['model']['params_m']:.0f}M parameters "
             f"({results['model']['non_embedding_m']:.0f}M outside the embedding), {results['model']['layers']} layers, "
             f"d_model {results['model']['d_model']}, sequence {results['model']['seq_len']}, global batch "
             f"{results['model']['batch']} sequences. Samples/s is the median of the second half of the telemetry "
             "intervals; MFU counts 6N + attention FLOPs per token against the datasheet peak (and, in brackets, "
             "against the measured matmul rate).", "",
             "| run | ranks | samples/s | tokens/s | MFU | data-wait share | ratio to DDP bf16 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    base = results["throughput"].get("ddp_bf16", {}).get("samples_per_s")
    for name, r in results["throughput"].items():
        if "samples_per_s" not in r:
            lines.append(f"| {name} | {r.get('ranks', '')} | failed: {r.get('error', '')[:120]} | | | | |")
            continue
        ratio = f"{r['samples_per_s'] / base:.2f}x" if base else ""
        lines.append(f"| {name} | {r['ranks']} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['mfu']:.1%} ({r['mfu_measured_peak']:.1%}) | {r['data_wait_share']:.3f} | {ratio} |")
    t = results.get("telemetry_cost", {})
    if t:
        lines += ["", f"Telemetry every step against every 10 steps (DDP bf16, steady-state samples/s): "
                      f"{t['ratio']:.3f}x ({t['every_step']:.1f} against {t['every_10']:.1f})."]
    nv = results.get("nvml", {})
    if nv:
        lines += ["", "NVML figures from the DDP bf16 run's telemetry (last interval): " +
                  ", ".join(f"{k} {v}" for k, v in nv.items()) + "."]
    d = results.get("determinism", {})
    if d:
        lines += ["", f"Determinism (`train.deterministic`, {d['model']}, {d['steps']} steps): two uninterrupted "
                      f"runs identical: **{d['uninterrupted_identical']}**; killed at step {d['kill_step']} and "
                      f"resumed from step {d.get('resumed_from_step')}: identical to the uninterrupted run: "
                      f"**{d['resumed_identical']}** (largest difference {d['resumed_max_abs_diff']:.3g})."]
    o = results.get("ordinal_check", {})
    if o:
        lines += ["", f"More ranks than GPUs ({o['ranks']} ranks, {o['gpus']} GPU): refused: **{o['refused']}** — "
                      f"`{o['message']}`"]
    if results.get("notes"):
        lines += [""] + [f"- {n}" for n in results["notes"]]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def write_section(text: str, path: Path) -> None:
    old = path.read_text() if path.exists() else ""
    if SECTION_START in old and SECTION_END in old:
        before, rest = old.split(SECTION_START, 1)
        after = rest.split(SECTION_END, 1)[1].lstrip("\n")
        new = before + text + ("\n" + after if after else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def publish(results: dict, root: Path, *, final: bool, smoke: bool) -> str:
    """Write what is known so far (a run cut short by its time limit still leaves its results)."""
    (root / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    section = markdown(results)
    if final and not smoke:
        write_section(section, REPO / "BENCHMARKS.md")
    out_dir = os.environ.get("OUT")
    if out_dir:
        shutil.copy(root / "gpu_check.json", Path(out_dir) / "gpu_check.json")
        Path(out_dir, "gpu_check_section.md").write_text(section)
        # One archive: the device tool brings back at most 8 files.
        subprocess.run(["tar", "czf", str(Path(out_dir) / "gpu_check_logs.tar.gz"), "-C", str(root)]
                       + sorted(f.name for f in root.glob("*.log")), check=False)
    return section


# ---------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/gpu_check")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--only", choices=["guards"],
                        help="guards: only the guards' cost (DDP bf16 with telemetry and guards on vs guards and "
                             "TensorBoard off, alternated twice)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on CPU (gloo): checks this script's plumbing on a machine without a GPU")
    args = parser.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    root = Path(args.work)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    smoke = args.smoke
    gpus = 1 if smoke else torch.cuda.device_count()
    nccl = "-" if smoke else torch.cuda.nccl.version()
    driver = "-" if smoke else subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                              capture_output=True, text=True).stdout.split("\n")[0].strip() or "?"
    name = "CPU (smoke)" if smoke else torch.cuda.get_device_name(0)
    spec = 1.0 if smoke else next((v for k, v in SPEC_BF16_TFLOPS.items() if k in name), None)
    measured = 1.0 if smoke else matmul_peak_tflops()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "environment": {
        "gpus": gpus, "gpu_name": name, "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "matmul_tflops": measured, "spec_tflops": spec}, "throughput": {}, "notes": []}
    if not smoke:
        torch.cuda.empty_cache()

    seq, vocab = (32, 64) if smoke else (1024, 16384)
    kw = ({"d_model": 32, "nhead": 2, "num_layers": 2, "dim_feedforward": 64} if smoke else
          {"d_model": 1024, "nhead": 16, "num_layers": 12, "dim_feedforward": 4096})
    per_gpu_batch = 4 if smoke else 16
    total, non_embed = count_params(kw, seq + 1, vocab)
    results["model"] = {"params_m": total / 1e6, "non_embedding_m": non_embed / 1e6, "layers": kw["num_layers"],
                        "d_model": kw["d_model"], "seq_len": seq, "batch": f"{per_gpu_batch} per GPU"}
    flops_token = lm_flops_per_token(non_embed, kw["num_layers"], kw["d_model"], seq)
    steps = 6 if smoke else args.steps
    data = token_dataset(root / "lm_data", n_train=per_gpu_batch * max(1, gpus) * (steps + 20), n_eval=64,
                         seq_len=seq, vocab=vocab)

    def throughput(run_name: str, ranks: int, **train) -> dict:
        cfg = lm_config(root, run_name, data, model_kwargs=kw, batch=per_gpu_batch * ranks, steps=steps, **train)
        run = torchrun(root, run_name, cfg, nproc=ranks, timeout=600)
        print(f"gpu_check: {run_name}: rc {run['returncode']} in {run['wall_s']} s", file=sys.stderr, flush=True)
        publish(results, root, final=False, smoke=smoke)
        if run["returncode"] != 0:
            results["throughput"][run_name] = {"ranks": ranks, "error": run["error_tail"][-400:].replace("\n", " ")}
            return run
        sps = steady_samples_per_s(run)
        tokens = sps * seq
        results["throughput"][run_name] = {
            "ranks": ranks, "samples_per_s": sps, "tokens_per_s": tokens,
            "mfu": tokens * flops_token / (ranks * spec * 1e12) if spec else float("nan"),
            "mfu_measured_peak": tokens * flops_token / (ranks * measured * 1e12),
            "data_wait_share": run["metrics"]["data_wait_share"], "wall_s": run["wall_s"]}
        return run

    if args.only == "guards":
        pairs: dict[str, list[float]] = {"on": [], "off": []}
        for rep in range(2):
            for which in ("on", "off") if rep == 0 else ("off", "on"):
                extra = {} if which == "on" else {"guards": {"enabled": False}}
                cfg = lm_config(root, f"guards_{which}_{rep}", data, model_kwargs=kw, batch=per_gpu_batch,
                                steps=steps, precision="bf16")
                cfg.update(extra)
                if which == "off":
                    cfg["telemetry"]["tensorboard"] = False
                run = torchrun(root, f"guards_{which}_{rep}", cfg, nproc=1, timeout=300)
                print(f"gpu_check: guards {which} {rep}: rc {run['returncode']}", file=sys.stderr, flush=True)
                if run["returncode"] == 0:
                    pairs[which].append(steady_samples_per_s(run))
        results["guards_cost"] = {"samples_per_s": pairs, "ratio_on_vs_off":
                                  statistics.median(pairs["on"]) / statistics.median(pairs["off"])
                                  if pairs["on"] and pairs["off"] else None}
        (root / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
        if os.environ.get("OUT"):
            shutil.copy(root / "gpu_check.json", Path(os.environ["OUT"]) / "gpu_check_guards.json")
        print(json.dumps(results["guards_cost"]))
        return 0

    ddp = throughput("ddp_bf16", 1, precision="bf16")
    throughput("fsdp_bf16", 1, sharding="fsdp", precision="bf16")
    throughput("ddp_fp32_tf32", 1, precision="fp32", tf32=True)
    throughput("ddp_fp32_no_tf32", 1, precision="fp32", tf32=False)
    if gpus > 1:
        throughput(f"ddp_bf16_x{gpus}", gpus, precision="bf16")
        throughput(f"fsdp_bf16_x{gpus}", gpus, sharding="fsdp", precision="bf16")
    else:
        results["notes"].append("One GPU on this machine: the all-GPU rows (and NCCL between GPUs) did not run.")

    if ddp.get("telemetry"):
        last = ddp["telemetry"][-1]
        results["nvml"] = {k: last[k] for k in ("gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_temperature_c",
                                                "gpu_power_watts", "gpu_throttle_reasons",
                                                "gpu_memory_peak_allocated_bytes", "per_rank_gpu_step_time_s",
                                                "per_rank_step_time_s") if k in last}

    every1 = throughput("ddp_bf16_telemetry_every_step", 1, precision="bf16", telemetry_every=1)
    results["throughput"].pop(every1["name"], None)
    if every1.get("telemetry") and ddp.get("telemetry"):  # the DDP bf16 run reports every 10 steps (the default)
        # Steady state, as the table: whole-run figures weigh the first interval's warm-up
        # (cuBLAS handles, the allocator's growth) differently when intervals differ in length.
        a, b = steady_samples_per_s(every1), steady_samples_per_s(ddp)
        results["telemetry_cost"] = {"every_step": a, "every_10": b, "ratio": a / b}

    # Determinism: a smaller model with attention and every kernel on its deterministic path.
    small = ({"d_model": 32, "nhead": 2, "num_layers": 2, "dim_feedforward": 64} if smoke else
             {"d_model": 256, "nhead": 4, "num_layers": 4, "dim_feedforward": 1024})
    dsteps, kill = (12, 7) if smoke else (40, 27)
    ddata = token_dataset(root / "det_data", n_train=32 * (dsteps + 4), n_eval=32, seq_len=32 if smoke else 256,
                          vocab=64 if smoke else 4096, seed=1)
    det = {}
    for run_name, env in (("det_a", None), ("det_b", None),
                          ("det_killed", {"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"0:{kill}"})):
        cfg = lm_config(root, run_name, ddata, model_kwargs={**small, "dropout": 0.1}, batch=32, steps=dsteps,
                        precision="bf16", deterministic=True, checkpoint_every=10)
        det[run_name] = torchrun(root, run_name, cfg, nproc=1, env=env, max_restarts=1 if env else 0)
        print(f"gpu_check: {run_name}: rc {det[run_name]['returncode']}", file=sys.stderr, flush=True)
    if all(r["returncode"] == 0 for r in det.values()):
        out = {k: Path(lm_config(root, k, ddata, model_kwargs=small, batch=32, steps=dsteps)["output_dir"]) for k in det}
        same_ab, _ = weights_equal(out["det_a"], out["det_b"])
        same_kill, diff = weights_equal(out["det_a"], out["det_killed"])
        results["determinism"] = {
            "model": "transformer_lm d_model 256, 4 layers, dropout 0.1, bf16", "steps": dsteps, "kill_step": kill,
            "resumed_from_step": det["det_killed"]["metrics"].get("resumed_from_step"),
            "uninterrupted_identical": same_ab, "resumed_identical": same_kill, "resumed_max_abs_diff": diff}
    else:
        results["determinism_error"] = {k: r.get("error_tail", "")[-600:] for k, r in det.items() if r["returncode"]}

    # The ordinal check: one more rank than there are GPUs.
    if smoke:
        DEVICE = "cuda"  # a CPU build refuses 'cuda' with its reason: the same path, checked here
    cfg = lm_config(root, "too_many_ranks", ddata, model_kwargs=small, batch=32 * (gpus + 1) // math.gcd(32, gpus + 1),
                    steps=2)
    bad = torchrun(root, "too_many_ranks", cfg, nproc=gpus + 1, timeout=180)
    log = (root / "too_many_ranks.log").read_text()
    m = re.search(r"DeviceError: ([^\n]+)", log)
    if smoke:
        DEVICE = "cpu"
    results["ordinal_check"] = {"ranks": gpus + 1, "gpus": gpus, "refused": bad["returncode"] != 0 and m is not None,
                                "message": m.group(1)[:300] if m else log[-300:]}

    publish(results, root, final=False, smoke=smoke)
    if not (args.skip_compile or smoke):  # last: compilation is the longest and least predictable part
        throughput("ddp_bf16_compile", 1, precision="bf16", compile=True)
    section = publish(results, root, final=True, smoke=smoke)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
