"""Measurements that run in the platform's .venv, one per process:
``python -m benchmarks.probes NAME --args JSON`` prints one JSON line.

- ``stall``: share of step time the runtime's loader keeps a fixed-cost compute step waiting.
- ``preprocess``: raw CSV -> shards: by the platform's assets' data path (source read in chunks,
  validated, written to Parquet, read back in batches and sharded; ``platform_ge`` adds the
  standard Great Expectations raw suite the assets run), by the whole-frame path (``load_frame`` +
  ``build_shards``), or by pyarrow + numpy writing the same bytes.
- ``checkpoint``: the runtime's synchronous checkpoint against ``torch.save``; the asynchronous
  mode's training stall (the save and the training step after it, less that step alone)
  against the synchronous save.
- ``load``: one epoch of the runtime's loader (for the growth figure).
Peak memory (RSS and anonymous RSS) is sampled during the measured section; ``data_limit_mb``
caps the process's data segment (RLIMIT_DATA: heap and anonymous mappings, not file-backed maps)
at that many MB above what it uses after imports, and ``memory_cgroup`` moves it into a memory
cgroup made by the harness (``benchmarks/memcg.py``: a limit on real memory, as a pod's) once
its imports are done.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import PeakMemory, emit


def _limit_data(extra_mb: float | None) -> int | None:
    if not extra_mb:
        return None
    with open("/proc/self/status") as f:
        data_kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmData:"))
    limit = data_kb * 1024 + int(extra_mb * 2**20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return limit


# ---------------------------------------------------------------- data stall
def stall(a: dict) -> dict:
    """The runtime's loader (``open_split`` over the v1 shards, ``TypedLoader`` with the runtime's
    defaults) feeding a compute step of fixed cost; ``before``: the loader of d0638fe
    (benchmarks/baselines/loader_d0638fe.py). Epochs are chained as the trainer chains them."""
    import torch

    from training_runtime.data.loader import TypedLoader, open_split
    from training_runtime.data.prefetch import chained_epochs
    from training_runtime.data.sampling import epoch_indices

    if a.get("before"):
        from benchmarks.baselines.loader_d0638fe import TypedLoaderBefore as TypedLoader  # noqa: F811
    torch.set_num_threads(1)
    data = Path(a["data"])
    man = json.loads((data / "shards" / "manifest.json").read_text())
    paths = [data / "shards" / s["path"] for s in man["splits"]["train"]["shards"]]
    split = open_split(man, paths, "train")
    dim = math.prod(man["feature_shape"])
    w = torch.randn(dim, a["width"])
    xb = torch.randn(a["batch"], dim)

    def compute(x: torch.Tensor) -> torch.Tensor:
        return (x @ w).relu_().sum()

    for _ in range(3):
        compute(xb)
    t = time.perf_counter()
    for _ in range(20):
        compute(xb)
    step_s = (time.perf_counter() - t) / 20
    total = wait = first_wait = 0.0
    steps = 0
    t_end = time.perf_counter() + a["seconds"]

    def make_loader(e: int, first: int):
        idx = epoch_indices(split.num_samples, 1, 0, e, 0)
        return TypedLoader(split, idx, a["batch"], first, torch.device("cpu"), epoch=e, seed=0,
                           num_workers=a["workers"], prefetch_batches=a["prefetch"])

    per_epoch = math.ceil(split.num_samples / a["batch"])
    for epoch, loader in chained_epochs(make_loader, 0, per_epoch, 10**9):
        t0 = time.perf_counter()
        for i, b in enumerate(loader):
            if i == 0:  # what the epoch's start costs: the first batch not yet gathered
                first_wait += loader.wait_s
            compute(b["features"])
            steps += 1
        total += time.perf_counter() - t0
        wait += loader.wait_s
        if time.perf_counter() >= t_end:
            break
    return {"stall_share": wait / total, "wait_s": wait, "loop_s": total, "steps": steps,
            "first_batch_wait_s": first_wait, "first_batch_share_of_wait": first_wait / max(wait, 1e-12),
            "epochs": epoch + 1, "compute_step_s": step_s, "workers": a["workers"]}


# ---------------------------------------------------------------- preprocessing
def _bench_spec(csv_name: str, dim: int, samples_per_shard: int, chunk_mb: float = 32.0):
    from core.spec import Source, model_pipeline

    return model_pipeline(
        "bench", source=Source(paths=(csv_name,), chunk_mb=chunk_mb), features=[f"f{i}" for i in range(dim)],
        label="label", id_column="sample_id", classes=range(10),
        split={"seed": 0, "samples_per_shard": samples_per_shard})


def _digest(out: Path, manifest: dict) -> str:
    h = hashlib.sha256()
    for split in sorted(manifest["splits"]):
        for s in manifest["splits"][split]["shards"]:
            h.update(s["sha256"].encode())
    h.update(json.dumps(manifest["normalisation"], sort_keys=True).encode())
    return h.hexdigest()


def _platform_shards(spec, src: Path, out: Path, with_suite: bool) -> dict:
    """What the raw_dataset and shards assets do with the data, without the store and Dagster."""
    from assets.ingest import ingest_chunks, iter_raw_arrays
    from assets.sharding import build_shards_from_chunks
    from assets.source import iter_source_chunks

    rows = spec.chunk_rows
    suite = spec.expectations.raw(spec) if with_suite else None
    ingested = ingest_chunks(spec, "bench/raw_dataset", suite, iter_source_chunks(spec, [src], rows), out / "raw.parquet")
    if not ingested.report.passed:
        raise ValueError(f"the bench source fails its checks: {ingested.report.failures[:3]}")
    return build_shards_from_chunks(
        iter_raw_arrays(spec, ingested.path, rows), out_dir=out / "shards", feature_columns=spec.feature_columns,
        label_column=spec.label_column, class_names=spec.class_names, id_column=spec.id_column,
        feature_shape=spec.shape, seed=0, fractions=(0.8, 0.1, 0.1),
        samples_per_shard=spec.split.samples_per_shard, block_rows=rows)


def preprocess(a: dict) -> dict:
    src = Path(a["source"])
    dim, sps, how = a["dim"], a["samples_per_shard"], a["how"]
    if how in ("platform", "platform_ge"):
        import pyarrow.csv  # noqa: F401  (the Arrow reader's module, as the baseline has it imported)
        import pyarrow.parquet  # noqa: F401
        import assets.ingest  # noqa: F401
        if how == "platform_ge":
            import great_expectations  # noqa: F401
    elif how == "whole":
        from assets.sharding import build_shards
        from assets.source import load_frame
    else:
        import pyarrow.csv as pacsv
    import pandas  # noqa: F401  (imported before the limit so only the work counts)

    spec = _bench_spec(src.name, dim, sps, a.get("chunk_mb", 32.0))  # validating a spec imports torch: not part of the work
    limit = _limit_data(a.get("data_limit_mb"))
    cgroup = a.get("memory_cgroup")  # {"version", "path", "limit_bytes"}: a real-memory limit from here on
    if cgroup:
        from benchmarks import memcg

        memcg.join(cgroup["path"])
    source_bytes = src.stat().st_size
    result: dict = {"how": how, "source_bytes": source_bytes, "data_limit_bytes": limit,
                    "memory_limit_bytes": cgroup["limit_bytes"] if cgroup else None}
    with tempfile.TemporaryDirectory(dir=a.get("tmp")) as tmp, PeakMemory() as mem:
        out = Path(tmp)
        t0 = time.perf_counter()
        try:
            if how in ("platform", "platform_ge"):
                manifest = _platform_shards(spec, src, out, how == "platform_ge")
                result["digest"] = _digest(out, manifest)
            elif how == "whole":
                frame, _ = load_frame(spec, src.parent)
                manifest = build_shards(
                    frame, out_dir=out, feature_columns=spec.feature_columns, label_column=spec.label_column,
                    class_names=spec.class_names, id_column=spec.id_column, feature_shape=spec.shape,
                    seed=0, fractions=(0.8, 0.1, 0.1), samples_per_shard=sps)
                result["digest"] = _digest(out, manifest)
            else:  # pyarrow reads, numpy writes the same bytes (features then labels per shard)
                table = pacsv.read_csv(src)
                cols = [f"f{i}" for i in range(dim)]
                x = np.empty((table.num_rows, dim), dtype="<f4")
                for j, c in enumerate(cols):
                    x[:, j] = table.column(c).to_numpy()
                y = table.column("label").to_numpy().astype("<i8")
                for i, s in enumerate(range(0, len(y), sps)):
                    with open(out / f"{i:05d}.bin", "wb") as f:
                        x[s:s + sps].tofile(f)
                        y[s:s + sps].tofile(f)
            result["ok"] = True
        except Exception as e:
            if limit is None:
                raise
            # under the data limit any allocation may fail: a MemoryError, or a thread whose
            # stack cannot be mapped (pandas' parallel CSV reader)
            result.update(ok=False, error=f"{type(e).__name__}: {e}")
        result["seconds"] = time.perf_counter() - t0
    result.update(peak_rss_bytes=mem.peak_rss, peak_anon_bytes=mem.peak_anon,
                  work_anon_bytes=mem.peak_anon - mem.start_anon,
                  mb_per_s=source_bytes / 2**20 / result["seconds"])
    if cgroup:
        result["cgroup_peak_bytes"] = memcg.peak_bytes(cgroup["version"], cgroup["path"])
    return result


# ---------------------------------------------------------------- checkpointing
def _train_setup(hidden: int, layers: int):
    """An MLP with AdamW after one step, and ``step()``, one more training step of it (batch 256)."""
    import torch

    torch.manual_seed(0)
    mods = []
    width = 1024
    for _ in range(layers):
        mods += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    model = torch.nn.Sequential(*mods, torch.nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()
    return model, opt, step


def checkpoint(a: dict) -> dict:
    import torch

    from training_runtime.checkpoint import full as ckpt
    from training_runtime.checkpoint.staging import copy_to_cpu

    model, opt, train_step = _train_setup(a["hidden"], a["layers"])

    def live_state(step: int) -> dict:  # what the trainer hands the writer: the live tensors
        return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": [ckpt.rng_state(torch.device("cpu"))]}

    state = live_state(1)
    buf = io.BytesIO()
    torch.save(state, buf)
    nbytes = len(buf.getvalue())
    del buf
    root = Path(a["dir"])
    root.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {k: [] for k in (
        "torch_save", "torch_save_fsync", "sync_durable", "sync_stall", "async_copy_stall", "train_step",
        "async_step", "async_stall", "async_wait")}
    # one writer per mode for the whole run, as the trainer keeps one: the async writer's host
    # staging copy is allocated by its first save and reused by the later ones
    writers = {"sync_writer": ckpt.CheckpointWriter(str(root / "sync_writer"), keep_last=1, async_save=False),
               "async_copy": ckpt.CheckpointWriter(str(root / "async_copy"), keep_last=1, async_save=True),
               "async": ckpt.CheckpointWriter(str(root / "async"), keep_last=1, async_save=True)}
    order = ["torch_save", "torch_save_fsync", "sync_durable", "sync_writer", "async_copy", "train_step", "async"]
    async_saved = sync_saved = None
    for rep in range(a["reps"]):
        state = live_state(rep)
        for what in order[rep % len(order):] + order[:rep % len(order)]:
            t = time.perf_counter()
            if what == "torch_save":
                torch.save(state, root / "plain.pt")
                times[what].append(time.perf_counter() - t)
                (root / "plain.pt").unlink()
            elif what == "torch_save_fsync":  # the durability write_checkpoint adds: file and directory fsync
                with open(root / "plain.pt", "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                ckpt.fsync_path(root)
                times[what].append(time.perf_counter() - t)
                (root / "plain.pt").unlink()
            elif what == "sync_durable":  # published and fsynced before it returns
                ckpt.write_checkpoint(root / "sync", rep, state, durable=True)
                times[what].append(time.perf_counter() - t)
                sync_saved = copy_to_cpu(state)
            elif what == "train_step":  # the step alone, for the async save's stall inside one
                train_step()
                times[what].append(time.perf_counter() - t)
                state = live_state(rep)
            elif what == "async":
                # the trainer's async save: the writer is told the optimizer, copies the parameters
                # and moments beside the next forward and backward, and that step's optimizer step
                # waits for the copy; the stall is the save plus the step, less the step alone
                w = writers[what]
                expected = copy_to_cpu(state)  # to check the checkpoint against, outside the timing
                t = time.perf_counter()
                w.save(rep, state, opt)
                saved_s = time.perf_counter() - t
                train_step()
                times["async_step"].append(time.perf_counter() - t)
                waited = w.take_deferred_wait_s()
                times["async_wait"].append(waited)
                times["async_stall"].append(saved_s + waited)  # training's wait, as the trainer counts it
                w.wait()
                async_saved = expected
                state = live_state(rep)
            else:
                # the sync writer returns once the checkpoint is published (fsync and pruning go on
                # in the background, and wait() below is outside the timing); async_copy is the
                # async writer without the optimizer: the whole copy made inside the save
                w = writers[what]
                w.save(rep, state)
                times["async_copy_stall" if what == "async_copy" else "sync_stall"].append(time.perf_counter() - t)
                w.wait()

    def holds(directory: Path, expected: dict) -> bool:  # the newest checkpoint verifies, loads, holds these tensors
        found = ckpt.find_latest_valid(directory)
        return (found is not None and found[1]["step"] == expected["step"]
                and all(torch.equal(found[1]["model"][k], v) for k, v in expected["model"].items())
                and all(torch.equal(found[1]["optimizer"]["state"][i][k], v)
                        for i, st in expected["optimizer"]["state"].items() for k, v in st.items()))

    return {"state_bytes": nbytes, "times": times, "checkpoint_loads": sync_saved is not None and holds(root / "sync", sync_saved),
            "async_checkpoint_loads": async_saved is not None and holds(root / "async", async_saved)}


# ---------------------------------------------------------------- loading (growth)
def load(a: dict) -> dict:
    import torch

    from training_runtime.data.loader import TypedLoader, open_split
    from training_runtime.data.sampling import epoch_indices

    data = Path(a["data"])
    man = json.loads((data / "shards" / "manifest.json").read_text())
    paths = [data / "shards" / s["path"] for s in man["splits"]["train"]["shards"]]
    for p in paths:  # page cache warm, as in the throughput figure
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        split = open_split(man, paths, "train")
        n = 0
        for e in range(a["epochs"]):
            idx = epoch_indices(split.num_samples, 1, 0, e, 0)
            for b in TypedLoader(split, idx, 256, 0, torch.device("cpu"), epoch=e, seed=0, num_workers=2):
                n += len(b["label"])
        dt = time.perf_counter() - t0
    return {"samples": n, "seconds": dt, "peak_rss_bytes": mem.peak_rss, "peak_anon_bytes": mem.peak_anon,
            "work_anon_bytes": mem.peak_anon - mem.start_anon,
            "data_bytes": sum(p.stat().st_size for p in paths)}


# ---------------------------------------------------------------- the guards' per-step work
def guard_step(a: dict) -> dict:
    """The guards' own per-step work (``TrainStep.guard``: gradient norm and the device-side
    non-finite counts) timed alone on the gradients of the scaling row's MLP, beside the whole
    step it is part of (forward, backward, AdamW); one thread, as each rank runs. The end-to-end
    row 5b adds telemetry and the watchdog, whose work is per interval, and the machine's noise."""
    from types import SimpleNamespace

    import torch

    from benchmarks import training
    from training_runtime.config import RunConfig
    from training_runtime.models.builtin import build_model
    from training_runtime.train.reporting import Interval
    from training_runtime.train.step import TrainStep, make_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = Path(a["data"])
    manifest = json.loads((data / "shards" / "manifest.json").read_text())
    cfg = RunConfig.from_dict(training.runtime_config(data, manifest, Path(a["work"]), global_batch=a["batch"],
                                                      max_steps=None))
    features = manifest["feature_shape"][0]
    model = build_model(cfg.model.name, [features], manifest["num_classes"], **cfg.model.kwargs)
    optimizer = make_optimizer(cfg, model)
    cpu = torch.device("cpu")
    step = TrainStep(SimpleNamespace(config=cfg, device=cpu), model, optimizer, scheduler=None)
    x, y = torch.randn(a["batch"], features), torch.randint(0, 10, (a["batch"],))

    def whole() -> torch.Tensor:  # what TrainStep does for one batch with the guards off
        optimizer.zero_grad(set_to_none=True)  # first, so the gradients stay for the guard's timing
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def timed(fn, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    iv, total = Interval(cpu), whole()  # gradients in place, as when the guards run
    guard = lambda: step.guard(total, iv, 1)  # noqa: E731
    steps, guards = [], []
    for _ in range(a["reps"]):  # alternated, each a median's sample
        steps.append(timed(whole, a["steps"]))
        guards.append(timed(guard, a["steps"] * 10))
    return {"step_s": steps, "guard_s": guards, "parameters": sum(p.numel() for p in model.parameters())}


PROBES = {"stall": stall, "preprocess": preprocess, "checkpoint": checkpoint, "load": load, "guard_step": guard_step}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes")
    ap.add_argument("probe", choices=sorted(PROBES))
    ap.add_argument("--args", required=True, help="JSON object of the probe's arguments")
    a = ap.parse_args(argv)
    emit(PROBES[a.probe](json.loads(a.args)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
