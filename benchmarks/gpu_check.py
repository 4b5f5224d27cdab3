"""The GPU check: what only a GPU machine can show, and issue 30's GPU targets met or missed, in
one run of under 8 minutes on one H200.

    bash benchmarks/gpu_check.sh                        # NVIDIA GPUs and torch with CUDA
    bash benchmarks/gpu_check.sh --only checkpoint      # one piece again (BENCHMARKS.md is left alone)
    python3 benchmarks/gpu_check.py --smoke             # tiny sizes on CPU: the plumbing only

It trains through the real entry point (``torchrun -m training_runtime``) on generated data, in
pieces (``--only`` names them):
- throughput: a transformer language model (~170M parameters) under DDP with bf16 autocast and
  FSDP2 with its bf16 MixedPrecisionPolicy, on one GPU and on all GPUs when there are several:
  steady-state samples/s, MFU, data-wait share, launch -> first training step, NVML figures;
- guards: telemetry, TensorBoard and guards on against off (on, off, on);
- loaders: the runtime's loader alone (no model), as the trainer builds it, over the LM's token
  shards and over generated JPEG shards, against what the GPU consumed from the same shards
  (the LM runs; a ResNet trained on the JPEGs);
- compile: the LM under torch.compile at the throughput runs' batch and at the largest larger
  batch (at most 4x) that the compiled run's peak memory says fits;
- checkpoint: the LM scaled to 1.04B parameters with async full checkpoints every N steps, the
  stall as the trainer reports it;
- determinism: two uninterrupted runs and one killed mid-run and resumed by torchrun, with
  ``train.deterministic``, compared bit for bit;
- ordinal: more ranks than GPUs is refused with the runtime's message;
- precision (not in the default run): fp32 with and without TF32 (0.43x and 0.14x of DDP bf16 on
  2026-11-30; they and the telemetry-every-step run, 1.005x, left the default run to make room
  for the targets' pieces).

It prints met or missed against each target (benchmarks/gpu_targets.py), writes
``gpu_check.json`` and, after a default run, replaces the "GPU check" section of BENCHMARKS.md
(both also copied to $OUT when set). It needs torch, numpy, psutil, nvidia-ml-py, safetensors,
torchmetrics and Pillow or simplejpeg: no Dagster.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import gpu_targets
from training_runtime.data.shard_format import FORMAT_V2, Column, ShardWriter

# Dense bf16 tensor-core peaks from NVIDIA's datasheets (SXM parts, no sparsity), TFLOP/s.
SPEC_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}
# The trainer's line before its first step (benchmarks/pipeline_job.py times row 6b by it too).
FIRST_STEP_MARK = "starting at step"

# ---------------------------------------------------------------- the time budget
# Seconds each piece takes on one H200, from the 2026-11-30 run (BENCHMARKS.md's GPU check
# section). A 169M-LM run of 60 steps: ~12 s of start (torchrun, imports, CUDA and NCCL, model
# build), 3.3 s of steps (60 x 16 samples at ~290/s) and ~5 s writing its final checkpoint
# (2.7 GB with AdamW) and weights: ~22 s.
PIECE_S = {
    "throughput": 45,   # ddp_bf16 and fsdp_bf16 (+60 s for the all-GPU pair on a machine of several)
    "guards": 45,       # guards off, then on again: with ddp_bf16 (on) an on-off-on sequence
    "loaders": 55,      # token loader alone 5 s; 8192 JPEGs made ~10 s; ResNet, 100 steps of 256 at
                        # ~10k/s + start ~30 s; image loader alone 5 s
    "compile": 150,     # two runs, each ~12 s of start, ~55 s compiling (a new batch is a new
                        # graph for inductor: its caches do not help), the steps (60 x 16 samples
                        # at ~350/s; 60 x 64 at ~400/s) and ~5 s of final checkpoint
    "checkpoint": 100,  # 1.04B LM: ~20 s start; 240 steps of 8 x 1024 tokens at ~0.16 s (6.5
                        # GFLOP/token at ~35 % MFU) = 38 s; two async saves of 12.5 GB, the last
                        # write waited for ~20 s; 4 GB of weights written
    "ordinal": 10,      # refused at start
    "determinism": 45,  # three 40-step runs of a d_model-256 LM, one killed and restarted by torchrun
    "precision": 65,    # fp32 + TF32: 60 x 16 samples at ~127/s = 8 s + start; without TF32 at ~40/s: 24 s + start
}
DEFAULT_PIECES = ["throughput", "guards", "loaders", "compile", "checkpoint", "ordinal", "determinism"]
# The default run, in this order: ~10 s of setup (imports, the matmul peak, 16k token windows),
# then the targets' pieces 45 + 45 + 55 + 150 + 100 = 395 s and the ordinal check's 10: ~415 s.
# Determinism (45 s, no target of its own) comes last and runs when the pieces before it left
# the time (else `--only determinism` runs it alone). A piece starts only if its estimate fits
# in what is left of BUDGET_S, so a slower machine loses its last pieces (reported as not run),
# not the report; a run is stopped 15 s past the budget (and given 15 s to go), so the script
# ends by ~470 s, inside gpu_check.sh's 480.
BUDGET_S = 440
EXTRA_GPUS_S = {"throughput": 60}  # added when the machine has several GPUs

DEVICE = "cuda"  # --smoke: "cpu"

# Sizes (GPU; --smoke uses the tiny ones in Check.__init__).
LM = {"d_model": 1024, "nhead": 16, "num_layers": 12, "dim_feedforward": 4096}
LM_1B = {"d_model": 2048, "nhead": 16, "num_layers": 20, "dim_feedforward": 8192}  # 1.04B with vocab 16384
RESNET = {"widths": [64, 128, 256], "blocks_per_stage": 2, "stem_stride": 2}
IMAGE_SIDE = 128  # benchmarks/typed_loaders.py's synthetic images
CHECKPOINT_EVERY = 120  # steps of the 1B LM between async saves (~19 s of training)


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
        per_shard = 4096
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


def _encode_jpeg():
    """simplejpeg's encoder where it is installed (the runtime decodes with it too), else Pillow's
    (the GPU machine's image has Pillow only); quality 90 and no chroma subsampling (simplejpeg's
    default) either way, so both make the same ~20 KB images."""
    if importlib.util.find_spec("simplejpeg") is not None:
        import simplejpeg

        return "simplejpeg", lambda img: simplejpeg.encode_jpeg(img, quality=90)
    import io

    from PIL import Image

    def encode(img: np.ndarray) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90, subsampling=0)
        return buf.getvalue()
    return "Pillow", encode


def image_dataset(root: Path, *, n_train: int, seed: int = 0):
    """128x128 RGB JPEGs of about 20 KB (benchmarks/typed_loaders.py's synthetic images: smooth
    colour fields with grain) with labels 0-9, as v2 image shards (train split) written by the
    runtime's writer; made on all cores."""
    from benchmarks.typed_loaders import SAMPLES_PER_SHARD, _synthetic_image

    _, encode = _encode_jpeg()
    columns = [Column("jpeg", "bytes", "input"), Column("label", "ndarray", "target", "int64"),
               Column("id", "str", "id")]

    def one(i: int) -> bytes:
        return encode(_synthetic_image(np.random.default_rng([seed, i])))

    writer, entries, locations, jpeg_bytes = ShardWriter(columns), [], {}, 0
    labels = np.random.default_rng([seed, n_train]).integers(0, 10, n_train)
    per_shard = SAMPLES_PER_SHARD["images"]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        for s, lo in enumerate(range(0, n_train, per_shard)):
            hi = min(n_train, lo + per_shard)
            rel = f"shards/train/{s:05d}.bin"
            part = {"jpeg": list(pool.map(one, range(lo, hi))), "label": labels[lo:hi],
                    "id": [f"img{i:08d}" for i in range(lo, hi)]}
            jpeg_bytes += sum(map(len, part["jpeg"]))
            entries.append(writer.write(root / rel, rel, part))
            locations[rel] = (root / rel).as_uri()
    manifest = {"format": FORMAT_V2, "columns": [c.to_dict() for c in columns], "kind": "images",
                "task": "classification", "num_classes": 10, "class_names": [str(c) for c in range(10)],
                "sample_shape": [IMAGE_SIDE, IMAGE_SIDE, 3],
                "splits": {"train": {"num_samples": n_train, "shards": entries}}}
    return manifest, locations, jpeg_bytes


# ---------------------------------------------------------------- runs
def run_config(root: Path, name: str, data, *, model: str = "transformer_lm", model_kwargs: dict, batch: int,
               steps: int, task: str = "language_modeling", **train) -> dict:
    manifest, locations = data[:2]
    checkpoint = {"dir": str(root / name / "ckpt"), "every_steps": train.pop("checkpoint_every", 10_000),
                  "keep_last": train.pop("keep_last", 2), "async_save": train.pop("checkpoint_async", False)}
    telemetry_every = train.pop("telemetry_every", 10)
    return {
        "model": {"name": model, "kwargs": model_kwargs},
        "data": {"commit_id": "gpu-check", "manifest": manifest, "locations": locations},
        "task": task,
        "train": {"epochs": 1000, "max_steps": steps, "batch_size": batch, "lr": 3e-4, "optimizer": "adamw",
                  "lr_schedule": "constant", "seed": 0, "device": DEVICE, "num_workers": 2, "prefetch_batches": 4,
                  **train},
        "validation": {"enabled": False},
        "checkpoint": checkpoint,
        "output_dir": str(root / name / "out"),
        "telemetry": {"every_steps": telemetry_every},
    }


def _stop(proc: subprocess.Popen) -> None:
    """A run past its limit: SIGTERM to torchrun, whose agent then ends its workers; SIGKILL to
    whatever of it and them is left after 15 s (a worker left alive would hold the output pipe
    open). Not a session of its own: what is left when this script itself is killed stays in the
    caller's session, which the caller ends."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:  # it ended as the limit came
        return
    proc.terminate()
    _, alive = psutil.wait_procs(family, timeout=15)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:  # ended between the wait and the kill
            pass


def torchrun(root: Path, name: str, config: dict, *, nproc: int, env: dict | None = None, max_restarts: int = 0,
             timeout: float = 300, keep_weights: bool = False) -> dict:
    """One training through the real entry point. Its output is read line by line as it comes,
    so the launch -> first step time is the trainer's own line's arrival. The checkpoints (and the
    weights, unless ``keep_weights``) are deleted afterwards: a 1B checkpoint is 12.5 GB and the
    machine's disk 64 GiB."""
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "-m", "training_runtime", "--config", str(path)]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    lines: list[str] = []
    first_step = None
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        timer = threading.Timer(max(1.0, timeout), _stop, (proc,))
        timer.start()
        try:
            for line in proc.stdout:
                if first_step is None and FIRST_STEP_MARK in line:
                    first_step = time.perf_counter() - t0
                lines.append(line)
            returncode = proc.wait()
        finally:
            timer.cancel()
    wall = time.perf_counter() - t0
    text = "".join(lines)
    (root / f"{name}.log").write_text(text)
    out = {"name": name, "returncode": returncode, "wall_s": round(wall, 1), "launch_to_first_step_s": first_step}
    weights = Path(config["output_dir"]) / "model.safetensors"
    for p in [Path(config["checkpoint"]["dir"])] + ([] if keep_weights else [weights]):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    if returncode != 0:
        killed = f"killed after its {timeout:.0f} s limit; " if wall >= timeout else ""
        out["error_tail"] = killed + text[-3000:]
        return out
    out["metrics"] = json.loads((Path(config["output_dir"]) / "metrics.json").read_text())
    out["telemetry"] = [json.loads(m.group(1)) for m in re.finditer(r" telemetry (\{.*\})$", text, re.MULTILINE)]
    return out


def steady(run: dict, key: str) -> float | None:
    """Median of ``key`` over the second half of the telemetry intervals (compilation, warm-up and
    the allocator's first growth stay out)."""
    values = [t[key] for t in run.get("telemetry", []) if key in t]
    return statistics.median(values[len(values) // 2:]) if values else None


def lm_flops_per_token(non_embedding: int, layers: int, d_model: int, seq_len: int, vocab: int) -> float:
    """Training FLOPs per token: 6 per weight of the matmuls (forward and backward), the tied
    output head's d_model x vocab included (its weights are the embedding's, so the parameter
    count outside the embedding leaves them out), plus attention's 12 * layers * seq_len *
    d_model (PaLM's appendix B; the causal mask's skipped half is not taken off: kernels compute
    it)."""
    return 6 * (non_embedding + d_model * vocab) + 12 * layers * seq_len * d_model


def count_params(model_kwargs: dict, seq_len: int, vocab: int) -> tuple[int, int]:
    """(all parameters, those outside the token and position embeddings), built on the meta device."""
    from training_runtime.models.builtin import TransformerLM

    with torch.device("meta"):
        m = TransformerLM([seq_len], vocab, **model_kwargs)
    total = sum(p.numel() for p in m.parameters())
    embed = sum(p.numel() for n, p in m.named_parameters() if "embed" in n or "pos" in n)
    return total, total - embed


def larger_batch(batch: int, peak_bytes: float | None, static_bytes: float, total_bytes: float, *,
                 share: float = 0.6, factors: tuple[int, ...] = (4, 2)) -> int | None:
    """The largest ``batch * factor`` whose predicted peak fits ``share`` of the GPU's memory:
    the measured peak less the static part (weights, gradients, optimizer state) grows with the
    batch. None when no larger batch fits or the peak is unknown. (0.6: compiled graphs and the
    allocator's fragmentation move the peak; a run that fails for memory costs its minute. At
    most 4x by default: the time budget holds about a minute for this run.)"""
    if peak_bytes is None or peak_bytes <= 0:
        return None
    per_batch = max(0.0, peak_bytes - static_bytes)
    for f in sorted(factors, reverse=True):
        if static_bytes + per_batch * f <= share * total_bytes:
            return batch * f
    return None


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


def loader_alone(name: str, config: dict, seconds: float) -> dict:
    """The runtime's loader as the trainer builds it for ``config`` (TrainingContext.epoch_loader:
    data.batches.split_loader over the same shards, batch, loader threads and prefetch, epochs
    chained, batches made model inputs on the training device), with no model: samples/s of
    batches ready on the device, after two warm-up batches."""
    from benchmarks.loaders import time_epochs
    from training_runtime.config import RunConfig
    from training_runtime.data.batches import split_loader
    from training_runtime.data.prefetch import chained_epochs
    from training_runtime.data.sampling import epoch_indices, steps_per_epoch
    from training_runtime.data.shards import resolve_shards
    from training_runtime.data.split import open_split
    from training_runtime.train.epochs import EpochBatches

    cfg = RunConfig.from_dict(config)
    t, info, manifest = cfg.train, cfg.data_info(), cfg.data.manifest
    paths = resolve_shards(manifest, cfg.data.locations, "train", cfg.cache_dir(), verify=False)
    split = open_split(manifest, paths, "train")
    n = manifest["splits"]["train"]["num_samples"]
    device = torch.device("cuda", 0) if t.device == "cuda" else torch.device("cpu")
    # Each batch counts once its own copy and conversion have run on the device (the loader's
    # side-stream prefetch of later batches is not waited for).
    ready = torch.cuda.current_stream(device).synchronize if device.type == "cuda" else (lambda: None)

    def make_loader(epoch: int, first: int):
        return split_loader(split, info, epoch_indices(n, 1, 0, epoch, t.seed), t.batch_size, first, device,
                            epoch=epoch, seed=t.seed, augment=t.augment, num_workers=t.num_workers,
                            prefetch_batches=t.prefetch_batches)

    def epochs(e: int):
        if e:
            raise RuntimeError("chained epochs never end")
        for _, loader in chained_epochs(make_loader, 0, steps_per_epoch(n, t.batch_size), 10**12):
            for batch in EpochBatches(loader, info):
                ready()
                yield batch["input"], batch.get("target", batch["input"])

    samples, batches, dt, _ = time_epochs(name, epochs, seconds)
    return {"loader_samples_per_s": samples / dt, "samples": samples, "batches": batches, "seconds": dt,
            "batch": t.batch_size, "loader_threads": t.num_workers, "device": device.type}


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


# ---------------------------------------------------------------- the pieces
class Check:
    """The runs of one invocation and what they found (``results``)."""

    def __init__(self, root: Path, results: dict, *, smoke: bool, gpus: int, spec: float | None, peak: float,
                 steps: int, budget: Budget):
        self.root, self.results, self.smoke, self.gpus, self.budget = root, results, smoke, gpus, budget
        self.failed: list[str] = []  # pieces that raised
        self.spec, self.peak = spec, peak
        self.steps = 6 if smoke else steps
        self.seq, self.vocab = (32, 64) if smoke else (1024, 16384)
        tiny = {"d_model": 32, "nhead": 2, "num_layers": 2, "dim_feedforward": 64}
        self.lm = tiny if smoke else LM
        self.lm_1b = {**tiny, "num_layers": 3} if smoke else LM_1B
        self.batch = 4 if smoke else 16  # per GPU
        total, non_embed = count_params(self.lm, self.seq + 1, self.vocab)
        self.lm_params = total
        layers, d_model = self.lm["num_layers"], self.lm["d_model"]
        self.flops_token = lm_flops_per_token(non_embed, layers, d_model, self.seq, self.vocab)
        results["model"] = {"params_m": total / 1e6, "non_embedding_m": non_embed / 1e6, "layers": layers,
                            "d_model": d_model, "seq_len": self.seq}
        self.lm_data = token_dataset(root / "lm_data", n_train=64 if smoke else 16384, n_eval=16 if smoke else 64,
                                     seq_len=self.seq, vocab=self.vocab)

    # ------------------------------------------------------------ helpers
    def piece(self, name: str, fn) -> None:
        estimate = PIECE_S[name] + (EXTRA_GPUS_S.get(name, 0) if self.gpus > 1 else 0)
        left = self.budget.left()
        if estimate > left:
            self.results["not_run"][name] = f"skipped: needs ~{estimate} s, {max(0.0, left):.0f} s of the budget left"
            print(f"gpu_check: {name}: {self.results['not_run'][name]}", file=sys.stderr, flush=True)
            return
        t0 = time.perf_counter()
        try:
            fn()
        # One piece's failure must not cost the device time of the others: it is recorded, its
        # traceback printed and kept with the logs, and the script's exit status says so.
        except Exception as e:  # noqa: BLE001
            trace = traceback.format_exc()
            (self.root / f"{name}.error.log").write_text(trace)
            print(trace, file=sys.stderr, flush=True)
            self.results["not_run"][name] = f"failed: {type(e).__name__}: {str(e)[:300]}"
            self.failed.append(name)
        self.results["piece_s"][name] = round(time.perf_counter() - t0, 1)
        print(f"gpu_check: {name}: {self.results['piece_s'][name]} s", file=sys.stderr, flush=True)

    def lm_config(self, name: str, ranks: int = 1, *, batch: int | None = None, model_kwargs: dict | None = None,
                  data=None, **train) -> dict:
        return run_config(self.root, name, data or self.lm_data, model_kwargs=model_kwargs or self.lm,
                          batch=batch or self.batch * ranks, steps=train.pop("steps", self.steps), **train)

    def run(self, name: str, config: dict, ranks: int = 1, **kw) -> dict:
        timeout = min(kw.pop("timeout", 600), max(10.0, self.budget.left() + 15))
        run = torchrun(self.root, name, config, nproc=ranks, timeout=timeout, **kw)
        print(f"gpu_check: {name}: rc {run['returncode']} in {run['wall_s']} s", file=sys.stderr, flush=True)
        return run

    def throughput(self, name: str, ranks: int = 1, *, kind: str = "lm", config: dict | None = None,
                   about: dict | None = None, **train) -> dict:
        """Train ``name`` and record its steady-state figures (and ``about``) in results["throughput"]."""
        cfg = config or self.lm_config(name, ranks, **train)
        run = self.run(name, cfg, ranks)
        batch = cfg["train"]["batch_size"]
        entry = {"kind": kind, "ranks": ranks, "batch": batch, "wall_s": run["wall_s"],
                 "launch_to_first_step_s": run["launch_to_first_step_s"], **(about or {})}
        sps = steady(run, "samples_per_second") if run["returncode"] == 0 else None
        if sps is None:
            entry["error"] = (run.get("error_tail", "no telemetry line in its log")[-400:]).replace("\n", " ")
        else:
            entry.update(samples_per_s=sps, steady_data_wait_share=steady(run, "data_wait_share"),
                         data_wait_share=run["metrics"]["data_wait_share"])
            if kind == "lm":
                tokens = sps * self.seq
                entry.update(tokens_per_s=tokens,
                             mfu=tokens * self.flops_token / (ranks * self.spec * 1e12) if self.spec else float("nan"),
                             mfu_measured_peak=tokens * self.flops_token / (ranks * self.peak * 1e12))
        self.results["throughput"][name] = entry
        self.publish()
        return run

    def publish(self, *, final: bool = False) -> str:
        return publish(self.results, self.root, final=final)

    # ------------------------------------------------------------ throughput
    def run_throughput(self) -> None:
        ddp = self.throughput("ddp_bf16", precision="bf16")
        self.throughput("fsdp_bf16", sharding="fsdp", precision="bf16")
        if self.gpus > 1:
            self.throughput(f"ddp_bf16_x{self.gpus}", self.gpus, precision="bf16")
            self.throughput(f"fsdp_bf16_x{self.gpus}", self.gpus, sharding="fsdp", precision="bf16")
        else:
            self.results["notes"].append(
                "One GPU on this machine: the all-GPU rows (and NCCL between GPUs) did not run.")
        if ddp.get("telemetry"):
            last = ddp["telemetry"][-1]
            self.results["nvml"] = {k: last[k] for k in (
                "gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_temperature_c", "gpu_power_watts",
                "gpu_throttle_reasons", "gpu_memory_peak_allocated_bytes", "per_rank_gpu_step_time_s",
                "per_rank_step_time_s") if k in last}

    def run_guards(self) -> None:
        """On (ddp_bf16 where it ran), off, on: drift over the minute cancels in the on runs' median."""
        pairs: dict[str, list[float]] = {"on": [], "off": []}
        names, sequence = [], [("off", "guards_off"), ("on", "guards_on")]
        base = self.results["throughput"].get("ddp_bf16", {}).get("samples_per_s")
        if base is not None:
            pairs["on"].append(base)
            names.append("ddp_bf16")
        else:
            sequence.insert(0, ("on", "guards_on_first"))
        for which, name in sequence:
            cfg = self.lm_config(name, precision="bf16")
            if which == "off":
                cfg["guards"] = {"enabled": False}
                cfg["telemetry"]["tensorboard"] = False
            run = self.run(name, cfg)
            sps = steady(run, "samples_per_second") if run["returncode"] == 0 else None
            if sps is None:
                self.results["not_run"]["guards"] = f"{name} failed: {run.get('error_tail', '')[-300:]}"
                return
            pairs[which].append(sps)
            names.append(name)
        self.results["guards_cost"] = {"samples_per_s": pairs, "runs": names}

    # ------------------------------------------------------------ loaders
    def run_loaders(self) -> None:
        seconds = 1.0 if self.smoke else 3.0
        tokens = loader_alone("token loader", self.lm_config("token_loader", precision="bf16"), seconds)
        # The LM runs that read the same shards at the same per-GPU batch on one GPU.
        self.results["loader"]["tokens"] = {**tokens, "consumers": ["ddp_bf16", "fsdp_bf16", "ddp_bf16_compile"],
                                            "dataset": f"{self.lm_data[0]['splits']['train']['num_samples']} windows "
                                                       f"of {self.seq + 1} uint16 tokens"}
        print(f"gpu_check: token loader alone: {tokens['loader_samples_per_s']:,.0f} samples/s", file=sys.stderr)
        n = 256 if self.smoke else 8192
        t0 = time.perf_counter()
        manifest, locations, jpeg_bytes = image_dataset(self.root / "image_data", n_train=n, seed=2)
        made_s = time.perf_counter() - t0
        model = {"widths": [8], "blocks_per_stage": 1, "stem_stride": 2} if self.smoke else RESNET
        batch = 32 if self.smoke else 256
        cfg = run_config(self.root, "resnet_jpeg_bf16", (manifest, locations), model="resnet", model_kwargs=model,
                         task="classification", batch=batch, steps=self.steps if self.smoke else 100, precision="bf16")
        self.throughput("resnet_jpeg_bf16", kind="image", config=cfg, about={"model": (
            f"resnet widths {model['widths']}, {model['blocks_per_stage']} blocks per stage, stem stride "
            f"{model['stem_stride']}, bf16, global batch {batch}")})
        images = loader_alone("image loader", cfg, seconds)
        self.results["loader"]["images"] = {
            **images, "consumers": ["resnet_jpeg_bf16"], "decoder": "simplejpeg" if _encode_jpeg()[0] == "simplejpeg"
            else "Pillow (simplejpeg is not installed)",
            "dataset": f"{n} generated {IMAGE_SIDE}x{IMAGE_SIDE} JPEGs, {jpeg_bytes / n / 1024:.0f} KB each "
                       f"(made in {made_s:.0f} s)"}
        print(f"gpu_check: image loader alone: {images['loader_samples_per_s']:,.0f} samples/s", file=sys.stderr)

    # ------------------------------------------------------------ compile
    def run_compile(self) -> None:
        """At the throughput runs' batch, then at the largest larger one that this run's peak
        memory says fits."""
        run = self.throughput("ddp_bf16_compile", precision="bf16", compile=True)
        peak = ((run.get("telemetry") or [{}])[-1].get("gpu_memory_peak_allocated_bytes")
                or self.results.get("nvml", {}).get("gpu_memory_peak_allocated_bytes"))  # the uncompiled run's
        total = torch.cuda.get_device_properties(0).total_memory if not self.smoke else 0
        bigger = larger_batch(self.batch, peak, 16 * self.lm_params, total)  # fp32 weights, grads, AdamW's two
        if bigger is None:
            self.results["notes"].append(f"compile at a larger batch: not run (peak memory at batch {self.batch}: "
                                         f"{peak}; GPU memory {total})")
            return
        self.throughput(f"ddp_bf16_compile_b{bigger}", batch=bigger, precision="bf16", compile=True)

    # ------------------------------------------------------------ checkpoint
    def run_checkpoint(self) -> None:
        every = 3 if self.smoke else CHECKPOINT_EVERY
        batch = 2 if self.smoke else 8
        total, non_embed = count_params(self.lm_1b, self.seq + 1, self.vocab)
        cfg = self.lm_config("checkpoint_1b", model_kwargs=self.lm_1b, batch=batch, steps=2 * every,
                             precision="bf16", checkpoint_every=every, checkpoint_async=True, keep_last=1)
        run = self.run("checkpoint_1b", cfg, timeout=300)
        k = self.lm_1b
        entry = {"model": f"transformer_lm d_model {k['d_model']}, {k['num_layers']} layers, feed-forward "
                          f"{k['dim_feedforward']}, sequence {self.seq}", "params": total, "batch": batch,
                 "every_steps": every, "state_gb": 12 * total / 1e9, "wall_s": run["wall_s"]}
        if run["returncode"] != 0:
            entry["error"] = run["error_tail"][-400:].replace("\n", " ")
        else:
            m, sps = run["metrics"], steady(run, "samples_per_second") or float("nan")
            flops = lm_flops_per_token(non_embed, k["num_layers"], k["d_model"], self.seq, self.vocab)
            entry.update(steps=m["steps"], saves=math.ceil(m["steps"] / every),
                         stall_s_total=m["checkpoint_stall_s_total"], train_time_s=m["train_time_s"],
                         samples_per_s=sps,
                         mfu=sps * self.seq * flops / (self.spec * 1e12) if self.spec else float("nan"))
        self.results["checkpoint"] = entry

    # ------------------------------------------------------------ determinism and the ordinal check
    def run_determinism(self) -> None:
        """A smaller model with attention and every kernel on its deterministic path."""
        small = ({"d_model": 32, "nhead": 2, "num_layers": 2, "dim_feedforward": 64} if self.smoke else
                 {"d_model": 256, "nhead": 4, "num_layers": 4, "dim_feedforward": 1024})
        dsteps, kill = (12, 7) if self.smoke else (40, 27)
        ddata = token_dataset(self.root / "det_data", n_train=32 * (dsteps + 4), n_eval=32,
                              seq_len=32 if self.smoke else 256, vocab=64 if self.smoke else 4096, seed=1)
        det = {}
        for name, env in (("det_a", None), ("det_b", None),
                          ("det_killed", {"TRAINING_RUNTIME_FAULT_KILL_AT_STEP": f"0:{kill}"})):
            cfg = self.lm_config(name, model_kwargs={**small, "dropout": 0.1}, data=ddata, batch=32, steps=dsteps,
                                 precision="bf16", deterministic=True, checkpoint_every=5 if self.smoke else 10)
            det[name] = self.run(name, cfg, env=env, max_restarts=1 if env else 0, keep_weights=True)
        if all(r["returncode"] == 0 for r in det.values()):
            out = {k: self.root / k / "out" for k in det}
            same_ab, _ = weights_equal(out["det_a"], out["det_b"])
            same_kill, diff = weights_equal(out["det_a"], out["det_killed"])
            self.results["determinism"] = {
                "model": f"transformer_lm d_model {small['d_model']}, {small['num_layers']} layers, dropout 0.1, bf16",
                "steps": dsteps, "kill_step": kill,
                "resumed_from_step": det["det_killed"]["metrics"].get("resumed_from_step"),
                "uninterrupted_identical": same_ab, "resumed_identical": same_kill, "resumed_max_abs_diff": diff}
        else:
            self.results["not_run"]["determinism"] = "; ".join(
                f"{k} failed: {r.get('error_tail', '')[-300:]}" for k, r in det.items() if r["returncode"])

    def run_ordinal(self) -> None:
        """One more rank than there are GPUs."""
        global DEVICE
        small = {"d_model": 32, "nhead": 2, "num_layers": 2, "dim_feedforward": 64}
        if self.smoke:
            DEVICE = "cuda"  # a CPU build refuses 'cuda' with its reason: the same path, checked here
        ranks = self.gpus + 1
        cfg = self.lm_config("too_many_ranks", ranks, model_kwargs=small, batch=4 * ranks, steps=2)
        if self.smoke:
            DEVICE = "cpu"
        bad = self.run("too_many_ranks", cfg, ranks, timeout=180)
        log = (self.root / "too_many_ranks.log").read_text()
        m = re.search(r"DeviceError: ([^\n]+)", log)
        self.results["ordinal_check"] = {"ranks": ranks, "gpus": self.gpus,
                                         "refused": bad["returncode"] != 0 and m is not None,
                                         "message": m.group(1)[:300] if m else log[-300:]}

    def run_precision(self) -> None:
        self.throughput("ddp_fp32_tf32", precision="fp32", tf32=True)
        self.throughput("ddp_fp32_no_tf32", precision="fp32", tf32=False)

    # ------------------------------------------------------------ the end
    def finish(self) -> None:
        """What the targets read from more than one piece: the launch figure beside the CPU's."""
        ddp = self.results["throughput"].get("ddp_bf16", {})
        launch = {"run": "ddp_bf16", "gpu_s": ddp.get("launch_to_first_step_s")}
        launch.update(cpu_launch_figure(REPO / "benchmarks" / "results.json"))
        self.results["launch"] = launch


def cpu_launch_figure(path: Path) -> dict:
    """Row 6b (run launch -> first training step, a Dagster run on the CPU machine) from
    benchmarks/results.json, and its date; empty when the file or the row is not there."""
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    first = saved.get("benchmarks", {}).get("overhead", {}).get("launch_to_first_step_s")
    return {} if first is None else {"cpu_s": first, "cpu_date": saved.get("date")}


# ---------------------------------------------------------------- report
def write_section(text: str, path: Path) -> None:
    old = path.read_text() if path.exists() else ""
    if gpu_targets.SECTION_START in old and gpu_targets.SECTION_END in old:
        before, rest = old.split(gpu_targets.SECTION_START, 1)
        after = rest.split(gpu_targets.SECTION_END, 1)[1].lstrip("\n")
        new = before + text + ("\n" + after if after else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def publish(results: dict, root: Path, *, final: bool) -> str:
    """Write what is known so far (a run cut short still leaves its results); ``final`` also
    replaces BENCHMARKS.md's section (a default run on a GPU only)."""
    results["verdicts"] = [v._asdict() for v in gpu_targets.verdicts(results)]
    (root / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    text = gpu_targets.section(results, gpu_targets.verdicts(results))
    if final:
        write_section(text, REPO / "BENCHMARKS.md")
    out_dir = os.environ.get("OUT")
    if out_dir:
        shutil.copy(root / "gpu_check.json", Path(out_dir) / "gpu_check.json")
        Path(out_dir, "gpu_check_section.md").write_text(text)
        # One archive: the device tool brings back at most 8 files.
        logs = sorted(f.name for f in root.glob("*.log"))
        if logs:
            subprocess.run(["tar", "czf", str(Path(out_dir) / "gpu_check_logs.tar.gz"), "-C", str(root), *logs],
                           check=True)
    return text


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/gpu_check")
    parser.add_argument("--steps", type=int, default=60, help="steps of each 169M-LM run")
    parser.add_argument("--only", action="append", choices=list(PIECE_S),
                        help="run only these pieces (repeatable); BENCHMARKS.md is then left alone")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="pieces start only while their estimate fits in what is left of this")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on CPU (gloo): checks this script's plumbing on a machine without a GPU")
    args = parser.parse_args(argv)
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (or --smoke for the plumbing on CPU)",
              file=sys.stderr)
        return 2
    budget = Budget(args.budget_s)
    root = Path(args.work)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    smoke = args.smoke
    gpus = 1 if smoke else torch.cuda.device_count()
    nccl = "-" if smoke else torch.cuda.nccl.version()
    driver = "-" if smoke else subprocess.run(  # informational: "?" when nvidia-smi says nothing
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=False).stdout.split("\n")[0].strip() or "?"
    name = "CPU (smoke)" if smoke else torch.cuda.get_device_name(0)
    spec = 1.0 if smoke else next((v for k, v in SPEC_BF16_TFLOPS.items() if k in name), None)
    peak = 1.0 if smoke else matmul_peak_tflops()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "environment": {
        "gpus": gpus, "gpu_name": name, "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "matmul_tflops": peak, "spec_tflops": spec}, "throughput": {}, "loader": {}, "notes": [],
        "not_run": {}, "piece_s": {}, "pieces": args.only or DEFAULT_PIECES}
    if spec is None:
        results["notes"].append(f"{name} is not in SPEC_BF16_TFLOPS: MFU against the datasheet is not measured.")
    if not smoke:
        torch.cuda.empty_cache()
    check = Check(root, results, smoke=smoke, gpus=gpus, spec=spec, peak=peak, steps=args.steps, budget=budget)
    for piece in results["pieces"]:
        if smoke and piece == "compile":
            results["not_run"][piece] = "smoke run on CPU: compilation is not what the CPU plumbing check is for"
            continue
        check.piece(piece, getattr(check, f"run_{piece}"))
    check.finish()
    results["wall_s"] = round(time.monotonic() - budget.t0, 1)
    text = check.publish(final=not (smoke or args.only))
    print(text)
    print("\n".join(gpu_targets.verdict_lines(gpu_targets.verdicts(results))))
    if check.failed:
        print(f"gpu_check: pieces that failed (tracebacks above and in <work>/<piece>.error.log): "
              f"{', '.join(check.failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
