"""The benchmark harness: ``python -m benchmarks.run [--size tiny|full] [--only NAME]``.

Runs the seven figures of issue 8 and the image ingest rows 8c/8d (benchmarks/image_ingest.py),
each as a ratio measured side by side in this one run
(repetitions interleaved, medians reported); ``--only gather``, ``--only image_loader`` and
``--only token_loader`` run figures that are left out by default (the v1 gather re-run, and the
typed-column loaders of shard format v2: benchmarks/typed_loaders.py), writes ``results.json`` and the results table of
``BENCHMARKS.md`` (between its markers; the notes around the table are kept). Every measurement
runs in its own subprocess; the peers run in ``benchmarks/.peers-venv`` (created by
``benchmarks/peers_setup.sh`` when missing, unless ``--no-peers``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.common import (
    BENCH, DATA, PEERS_PY, PEERS_VENV, REPO, VENV_PY, ProbeError, fit_exponent, load_average, machine,
    median, rotate, run_json)

SIZES = {
    "tiny": {"reps": 1, "loader_seconds": 0.4, "rows_4k": 1100, "rows_192k": 120, "stall_seconds": 0.5,
             "pre_rows": 2000, "pre_dim": 64, "ckpt_hidden": 256, "ckpt_reps": 1, "scale_steps": 4,
             "scale_rows": 1200, "over_rows": 1500, "over_target_s": 1.0, "growth_rows": 300,
             "growth_samples": 512, "limit_mb": 64, "chunk_mb": 0.5, "timeout": 300,
             "images": 1024, "token_windows": 16384, "typed_seconds": 1.5, "typed_reps": 3,
             "image_folder": 192},
    "full": {"reps": 3, "loader_seconds": 2.0, "rows_4k": 17000, "rows_192k": 1420, "stall_seconds": 4.0,
             "pre_rows": 12000, "pre_dim": 256, "ckpt_hidden": 2048, "ckpt_reps": 5, "scale_steps": 40,
             "scale_rows": 20000, "over_rows": 20000, "over_target_s": 70.0, "growth_rows": 2000,
             "growth_samples": 4096, "limit_mb": 64, "chunk_mb": 2.0, "timeout": 900,
             "images": 4096, "token_windows": 131072, "typed_seconds": 3.0, "typed_reps": 3,
             "image_folder": 4096},  # 8c's JPEGs; 8d ingests 1/16, 1/4 and all of them
}
BENCHMARKS = ("loaders", "stall", "preprocess", "checkpoint", "scaling", "overhead", "growth", "image_preprocess",
              "image_memory", "guards")
EXTRA = ("gather", "image_loader", "token_loader")  # run only when named with --only
IMAGE_PEERS = ("streaming", "webdataset")
PEERS = ("streaming", "webdataset", "pandas")
MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"


class Ctx:
    def __init__(self, size: str, data: Path, peers: bool):
        self.size, self.p, self.data, self.peers = size, SIZES[size], data, peers
        self.py = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
        self.peer_problem: str | None = None

    def probe(self, name: str, args: dict, timeout: float | None = None, env: dict | None = None) -> dict:
        return run_json([self.py, "-m", "benchmarks.probes", name, "--args", json.dumps(args)],
                        timeout=timeout or self.p["timeout"], env=env)


# ---------------------------------------------------------------- peers' environment
def ensure_peers(ctx: Ctx) -> None:
    if not ctx.peers:
        ctx.peer_problem = "peers not run (--no-peers)"
        return
    if (PEERS_VENV / ".installed").exists():
        return
    p = subprocess.run(["bash", str(BENCH / "peers_setup.sh")], capture_output=True, text=True, timeout=1200)
    if p.returncode != 0 or not (PEERS_VENV / ".installed").exists():
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if not ln.startswith("WARNING: Location")]
        ctx.peer_problem = "peers' venv could not be installed: " + " | ".join(lines[-3:])


# ---------------------------------------------------------------- 1. loader throughput
def bench_gather(ctx: Ctx) -> dict:
    """The runtime's loader, and its gather as before 363bf0b (benchmarks/baselines), against the
    memory-read limit, without the peers (a quicker re-run of that part of figure 1)."""
    return bench_loaders(ctx, peers=False)


def bench_loaders(ctx: Ctx, peers: bool = True) -> dict:
    from benchmarks import datagen

    p = ctx.p
    out: dict = {"batch": 256, "workers": 2, "seconds_per_measurement": p["loader_seconds"], "sizes": {}}
    for label, dim, rows in (("4KB", 1024, p["rows_4k"]), ("192KB", 49152, p["rows_192k"])):
        data = ctx.data / f"loader_{label}_{ctx.size}"
        man = datagen.shard_dataset(data, rows=rows, dim=dim, samples_per_shard=datagen.platform_shard_samples(dim))
        n = man["splits"]["train"]["num_samples"]
        entry: dict = {"train_samples": n, "train_bytes": n * (dim * 4 + 8), "runs": {}, "errors": {}}
        loaders = ["memmap", "ours", "ours_before"]
        if not peers:
            pass
        elif ctx.peer_problem is None:
            try:
                entry["peer_files"] = run_json([str(PEERS_PY), "-m", "benchmarks.loaders", "write-peers",
                                                "--data", str(data)], timeout=p["timeout"])
                loaders += list(PEERS)
            except ProbeError as e:
                for peer in PEERS:
                    entry["errors"][peer] = f"writing peer formats failed: {e}"
        else:
            for peer in PEERS:
                entry["errors"][peer] = ctx.peer_problem
        for rep in range(p["reps"]):
            for name in rotate(loaders, rep):
                if name in entry["errors"]:
                    continue
                py = str(PEERS_PY) if name in PEERS else ctx.py
                try:
                    r = run_json([py, "-m", "benchmarks.loaders", "measure", "--loader", name, "--data", str(data),
                                  "--seconds", str(p["loader_seconds"]), "--workers", "2"], timeout=p["timeout"])
                    entry["runs"].setdefault(name, []).append(r["samples_per_s"])
                except ProbeError as e:
                    entry["errors"][name] = str(e)[-600:]
        med = {k: median(v) for k, v in entry["runs"].items()}
        entry["median_samples_per_s"] = med
        if "memmap" in med:
            entry["vs_memory_read_limit"] = {k: v / med["memmap"] for k, v in med.items()}
        peer_med = {k: v for k, v in med.items() if k in PEERS}
        if peer_med and "ours" in med:
            best = max(peer_med, key=peer_med.get)
            entry["best_peer"] = best
            entry["ours_vs_best_peer"] = med["ours"] / peer_med[best]
        out["sizes"][label] = entry
    return out


# ---------------------------------------------------------------- 8. typed-column (v2) loaders
def _typed_measure(ctx: Ctx, kind: str, data: Path, loaders: list[str], errors: dict, threads: int) -> dict:
    """Each loader ``typed_reps`` times, rounds interleaved; returns the samples/s per loader."""
    runs: dict[str, list[float]] = {}
    for rep in range(ctx.p["typed_reps"]):
        for name in rotate(loaders, rep):
            if name in errors:
                continue
            py = str(PEERS_PY) if name in IMAGE_PEERS else ctx.py
            try:
                r = run_json([py, "-m", "benchmarks.typed_loaders", "measure", "--kind", kind, "--loader", name,
                              "--data", str(data), "--seconds", str(ctx.p["typed_seconds"]), "--threads", str(threads)],
                             timeout=ctx.p["timeout"])
                runs.setdefault(name, []).append(r["samples_per_s"])
            except ProbeError as e:
                errors[name] = str(e)[-600:]
    return runs


def _image_peers(ctx: Ctx, data: Path, errors: dict) -> dict:
    """Peer copies of the JPEGs, written in the peers' venv; a peer that does not import there is
    left out with the reason."""
    if ctx.peer_problem is not None:
        errors.update({peer: ctx.peer_problem for peer in IMAGE_PEERS})
        return {}
    for peer, module in (("streaming", "streaming"), ("webdataset", "webdataset")):
        p = subprocess.run([str(PEERS_PY), "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            errors[peer] = f"{module} does not import in benchmarks/.peers-venv: {p.stderr.strip()[-300:]}"
    if all(peer in errors for peer in IMAGE_PEERS):
        return {}
    try:
        return run_json([str(PEERS_PY), "-m", "benchmarks.typed_loaders", "write-peers", "--data", str(data)],
                        timeout=ctx.p["timeout"])
    except ProbeError as e:
        errors.update({peer: f"writing peer formats failed: {e}" for peer in IMAGE_PEERS if peer not in errors})
        return {}


def bench_image_loader(ctx: Ctx) -> dict:
    """The typed loader on 128x128 JPEGs of about 20 KB against the decoder alone (simplejpeg on
    the same bytes, in a plain loop, on as many threads), and the peers on the same JPEGs."""
    data = ctx.data / f"images_128_{ctx.size}"
    threads = len(os.sched_getaffinity(0))
    written = run_json([ctx.py, "-m", "benchmarks.typed_loaders", "write-images", "--data", str(data),
                        "--images", str(ctx.p["images"])], timeout=ctx.p["timeout"])
    errors: dict[str, str] = {}
    peer_files = _image_peers(ctx, data, errors)
    runs = _typed_measure(ctx, "images", data, ["decoder", "ours", "ours_augmented", *IMAGE_PEERS], errors, threads)
    med = {k: median(v) for k, v in runs.items()}
    out = {"batch": 256, "threads": threads, "image": "128x128x3 JPEG, quality 90", "seconds_per_measurement":
           ctx.p["typed_seconds"], **written, "mean_jpeg_bytes": written["shard_bytes"] / written["samples"],
           "peer_files": peer_files, "runs": runs, "errors": errors, "median_samples_per_s": med}
    if "decoder" in med:
        out["vs_decoder_alone"] = {k: v / med["decoder"] for k, v in med.items()}
    return out


def bench_token_loader(ctx: Ctx) -> dict:
    """The typed loader on int32 token windows of 129 against the memory-read limit (contiguous
    batch slices of the memory-mapped shards, as figure 1 measures it for v1)."""
    data = ctx.data / f"tokens_129_{ctx.size}"
    written = run_json([ctx.py, "-m", "benchmarks.typed_loaders", "write-tokens", "--data", str(data),
                        "--windows", str(ctx.p["token_windows"])], timeout=ctx.p["timeout"])
    errors: dict[str, str] = {}
    runs = _typed_measure(ctx, "tokens", data, ["memmap", "ours"], errors, threads=2)
    med = {k: median(v) for k, v in runs.items()}
    out = {"batch": 256, "window": 129, "dtype": "int32", "loader_threads": 2, "seconds_per_measurement":
           ctx.p["typed_seconds"], **written, "runs": runs, "errors": errors, "median_samples_per_s": med}
    if "memmap" in med:
        out["vs_memory_read_limit"] = {k: v / med["memmap"] for k, v in med.items()}
    return out


# ---------------------------------------------------------------- 8c/8d. image ingest
IMAGE_GROWTH = (1, 4, 16)  # 8d: the folder's size, as a share of 16 (every 16th, 4th, every file)


def _image_folder(ctx: Ctx) -> tuple[Path, dict]:
    """The JPEG folder of 8c and 8d, and its raw copy, written once."""
    n = ctx.p["image_folder"]
    data = ctx.data / f"image_folder_96_{n}"
    return data, run_json([ctx.py, "-m", "benchmarks.image_ingest", "write", "--data", str(data), "--images", str(n)],
                          timeout=ctx.p["timeout"])


def bench_image_preprocess(ctx: Ctx) -> dict:
    """The shards asset's image path against a plain Pillow script in a process pool, on the same
    JPEGs with as many processes (os.cpu_count(), the platform's default); and the platform's
    path once more with its pool's forkserver already running, which tells its start-up apart."""
    data, written = _image_folder(ctx)
    workers = os.cpu_count() or 1
    runs: dict[str, list[dict]] = {}
    for rep in range(ctx.p["reps"]):
        for how in rotate(["platform", "platform_warm", "plain"], rep):
            runs.setdefault(how, []).append(run_json(
                [ctx.py, "-m", "benchmarks.image_ingest", "measure", "--how", how, "--data", str(data),
                 "--workers", str(workers)], timeout=ctx.p["timeout"]))
    ips = {k: median([r["images_per_s"] for r in v]) for k, v in runs.items()}
    return {**written, "sample": "64x64x3 uint8", "workers": workers, "median_images_per_s": ips,
            "platform_vs_plain": ips["platform"] / ips["plain"],
            "platform_warm_vs_plain": ips["platform_warm"] / ips["plain"],
            "forkserver_start_s": median([r["forkserver_start_s"] for r in runs["platform_warm"]]),
            "same_pixels": len({r["digest"] for v in runs.values() for r in v}) == 1, "runs": runs}


def bench_image_memory(ctx: Ctx) -> dict:
    """Peak memory of the whole process tree of image ingest (raw_dataset's ingest, the shards
    asset's sharding and checks) over 1x, 4x and 16x images, one child process per size."""
    data, written = _image_folder(ctx)
    sizes = {str(f): run_json([ctx.py, "-m", "benchmarks.image_ingest", "memory", "--data", str(data),
                               "--stride", str(max(IMAGE_GROWTH) // f)], timeout=ctx.p["timeout"])
             for f in IMAGE_GROWTH}
    first, last = sizes[str(IMAGE_GROWTH[0])], sizes[str(IMAGE_GROWTH[-1])]
    growth = {k: last[k] / first[k] for k in ("peak_tree_rss_bytes", "peak_tree_pss_bytes", "peak_tree_anon_bytes",
                                               "main_max_rss_bytes")}
    return {**written, "factors": list(IMAGE_GROWTH), "sizes": sizes, "growth_16x_vs_1x": growth,
            "tree_rss_16x_vs_1x": growth["peak_tree_rss_bytes"]}


# ---------------------------------------------------------------- 2. data stall
def bench_stall(ctx: Ctx) -> dict:
    from benchmarks import datagen

    data = ctx.data / f"loader_4KB_{ctx.size}"
    datagen.shard_dataset(data, rows=ctx.p["rows_4k"], dim=1024, samples_per_shard=datagen.platform_shard_samples(1024))
    runs: dict[str, list[dict]] = {"runtime": [], "before": [], "two_workers": []}
    for rep in range(ctx.p["reps"]):
        for which in rotate(list(runs), rep):
            runs[which].append(ctx.probe("stall", {
                "data": str(data), "batch": 256, "width": 256, "workers": 2 if which == "two_workers" else 1,
                "prefetch": 4, "seconds": ctx.p["stall_seconds"], "before": which == "before"}))
    return {"sample": "4KB", "batch": 256, "loader": "runtime defaults: num_workers=1, prefetch_batches=4",
            "runs": runs, "stall_share": median([r["stall_share"] for r in runs["runtime"]]),
            "stall_share_before": median([r["stall_share"] for r in runs["before"]]),
            "first_batch_share_of_wait": median([r["first_batch_share_of_wait"] for r in runs["runtime"]]),
            "stall_share_two_workers": median([r["stall_share"] for r in runs["two_workers"]]),
            "compute_step_s": median([r["compute_step_s"] for r in runs["runtime"]])}


# ---------------------------------------------------------------- 3. preprocessing
# RLIMIT_DATA counts address space that allocators reserve but never touch: Arrow's default pool
# (jemalloc/mimalloc) and glibc's per-thread arenas reserve tens of MB each. Under a limit, run as
# one would in a small container: Arrow on the system allocator, two malloc arenas.
LIMITED_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}
# the assets' data path; it with their Great Expectations raw suite; the whole-frame functions
PREPROCESS_PATHS = ["platform", "platform_ge", "whole"]


def bench_preprocess(ctx: Ctx) -> dict:
    from benchmarks import datagen

    p = ctx.p
    src = datagen.csv_source(ctx.data / "csv" / f"pre_{ctx.size}.csv", rows=p["pre_rows"], dim=p["pre_dim"])
    runs: dict[str, list[dict]] = {}
    for rep in range(p["reps"]):
        for how in rotate(PREPROCESS_PATHS + ["pyarrow"], rep):
            runs.setdefault(how, []).append(ctx.probe("preprocess", {
                "source": str(src), "dim": p["pre_dim"], "samples_per_shard": 4096, "how": how,
                "tmp": str(ctx.data)}))
    mbps = {k: median([r["mb_per_s"] for r in v]) for k, v in runs.items()}
    return {"source_bytes": src.stat().st_size, "rows": p["pre_rows"], "features": p["pre_dim"],
            "median_mb_per_s": mbps, **{f"{k}_vs_pyarrow": mbps[k] / mbps["pyarrow"] for k in PREPROCESS_PATHS},
            "same_shards": len({r["digest"] for k in PREPROCESS_PATHS for r in runs[k]}) == 1,
            "runs": runs}


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
            "async_stall_vs_sync": t["async_stall"] / t["sync_stall"]}


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
    alternated side by side; the figure is the ratio of their step times."""
    from benchmarks import datagen, training

    data = ctx.data / f"train_256_{ctx.size}"
    man = datagen.shard_dataset(data, rows=ctx.p["scale_rows"], dim=256, samples_per_shard=4096)
    per_rank, nproc = 256, 2
    runs: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="guards-") as tmp:
        for rep in range(ctx.p["reps"]):
            for which in rotate(list(runs), rep):
                cfg = training.runtime_config(data, man, Path(tmp) / which, global_batch=per_rank * nproc,
                                              max_steps=ctx.p["scale_steps"])
                if which == "off":
                    cfg["guards"] = {"enabled": False}
                    cfg["telemetry"] = {"every_steps": 10**6, "tensorboard": False}
                m = training.torchrun(cfg, Path(tmp) / which, nproc, timeout=ctx.p["timeout"])
                runs[which].append(max(m["per_rank_step_time_s"]))
    step = {k: median(v) for k, v in runs.items()}
    return {"model": training.MODEL, "per_rank_batch": per_rank, "ranks": nproc, "median_step_s": step,
            "cost": step["on"] / step["off"] - 1.0, "runs": runs}


# ---------------------------------------------------------------- 6. platform overhead
def bench_overhead(ctx: Ctx) -> dict:
    from benchmarks import datagen

    p = ctx.p
    src = datagen.csv_source(ctx.data / "csv" / f"overhead_{ctx.size}.csv", rows=p["over_rows"], dim=256)
    plain = [ctx.py, "-m", "benchmarks.plain_pipeline", "--source", str(src), "--dim", "256"]
    calib = run_json(plain + ["--epochs", "1"], timeout=p["timeout"])
    epochs = max(1, math.ceil(p["over_target_s"] / calib["train_s"]))
    t0 = time.perf_counter()
    plain_r = run_json(plain + ["--epochs", str(epochs)], timeout=p["timeout"])
    plain_wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="dagster-home-") as home:
        Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        launched = time.time()
        t0 = time.perf_counter()
        plat = run_json([ctx.py, "-m", "benchmarks.pipeline_job", "--source", str(src), "--dim", "256",
                         "--epochs", str(epochs), "--launched-at", str(launched)],
                        timeout=p["timeout"] * 2, env={"DAGSTER_HOME": home, "PLATFORM_PROFILE": "local"})
        plat_wall = time.perf_counter() - t0
    first = plat["first_step_at"]
    return {"rows": p["over_rows"], "source_bytes": src.stat().st_size, "epochs": epochs,
            "plain": {"wall_s": plain_wall, **plain_r}, "platform": {"wall_s": plat_wall, **plat},
            "platform_vs_plain": plat_wall / plain_wall,
            "launch_to_first_step_s": None if first is None else first - launched,
            "execute_to_first_step_s": None if first is None else first - plat["execute_at"],
            "note": "run once (each side takes minutes); not interleaved"}


# ---------------------------------------------------------------- 7. growth
def bench_growth(ctx: Ctx) -> dict:
    from benchmarks import datagen

    p = ctx.p
    factors = [1, 4, 16]
    pre: dict[str, dict] = {how: {} for how in PREPROCESS_PATHS}
    srcs = {f: datagen.csv_source(ctx.data / "csv" / f"growth_{ctx.size}_{f}x.csv", rows=p["growth_rows"] * f,
                                  dim=256) for f in factors}
    for f in factors:
        for how in PREPROCESS_PATHS:
            pre[how][str(f)] = ctx.probe("preprocess", {
                "source": str(srcs[f]), "dim": 256, "samples_per_shard": 4096, "how": how,
                "chunk_mb": p["chunk_mb"], "tmp": str(ctx.data)})
    load: dict[str, dict] = {}
    for f in factors:
        data = ctx.data / f"growth_load_{ctx.size}_{f}x"
        datagen.train_only_shards(data, samples=p["growth_samples"] * f, dim=1024,
                                  samples_per_shard=datagen.platform_shard_samples(1024))
        load[str(f)] = ctx.probe("load", {"data": str(data), "epochs": 2})
    big = srcs[16]
    limited = {how: ctx.probe("preprocess", {
        "source": str(big), "dim": 256, "samples_per_shard": 4096, "how": how, "chunk_mb": p["chunk_mb"],
        "tmp": str(ctx.data), "data_limit_mb": p["limit_mb"]}, env=LIMITED_ENV) for how in PREPROCESS_PATHS}

    def summary(series: dict[str, dict], key: str = "seconds") -> dict:
        sizes = [float(f) for f in factors]
        times = [series[str(f)][key] for f in factors]
        return {"seconds": dict(zip(map(str, factors), times)), "exponent": fit_exponent(sizes, times),
                "work_anon_mb": {str(f): series[str(f)]["work_anon_bytes"] / 2**20 for f in factors},
                "peak_rss_mb": {str(f): series[str(f)]["peak_rss_bytes"] / 2**20 for f in factors},
                "anon_growth_16x_vs_1x": series["16"]["work_anon_bytes"] / max(1, series["1"]["work_anon_bytes"])}
    return {"factors": factors, "preprocess_rows_1x": p["growth_rows"], "load_samples_1x": p["growth_samples"],
            "chunk_mb": p["chunk_mb"],
            "preprocess": {k: summary(v) for k, v in pre.items()}, "load": summary(load),
            "memory_limit": {"source_bytes": big.stat().st_size, "limit_mb_above_imports": p["limit_mb"],
                             **limited},
            "raw": {"preprocess": pre, "load": load}}


RUNNERS = {"loaders": bench_loaders, "gather": bench_gather, "stall": bench_stall, "preprocess": bench_preprocess,
           "checkpoint": bench_checkpoint, "scaling": bench_scaling, "overhead": bench_overhead,
           "guards": bench_guards,
           "growth": bench_growth, "image_loader": bench_image_loader, "token_loader": bench_token_loader,
           "image_preprocess": bench_image_preprocess, "image_memory": bench_image_memory}


# ---------------------------------------------------------------- report
def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def _typed_rows(b: dict, add) -> None:
    """Rows of figure 8, the typed-column (v2) loaders."""
    def side(e: dict, ratios: dict) -> str:
        med = e.get("median_samples_per_s", {})
        return "; ".join([f"{k} {_f(v, '{:,.0f}')}/s ({_f(ratios.get(k))}×)" for k, v in med.items()]
                         + [f"{k}: not measured ({v[:160]})" for k, v in e.get("errors", {}).items()])

    e = b.get("image_loader")
    if e and "error" not in e:
        r = e.get("vs_decoder_alone", {})
        ours = r.get("ours")
        add(f"8a. image loader, {e['samples']} JPEGs 128×128 (~{e['mean_jpeg_bytes'] / 1000:.0f} KB), batch 256, "
            f"{e['threads']} decode threads",
            f"ours {_f(ours)}× the decoder alone; with random crop 112 + flip {_f(r.get('ours_augmented'))}×",
            side(e, r), "≥ 0.8× decoder alone", None if ours is None else ours >= 0.8)
    e = b.get("token_loader")
    if e and "error" not in e:
        r = e.get("vs_memory_read_limit", {})
        ours = r.get("ours")
        add(f"8b. token loader, {e['samples']} int32 windows of 129 ({e['shard_bytes'] / 2**20:.0f} MB), batch 256",
            f"ours {_f(ours)}× memory-read limit", side(e, r), "≥ 0.5× limit",
            None if ours is None else ours >= 0.5)


def _image_ingest_rows(b: dict, add) -> None:
    """Rows 8c and 8d, image ingest."""
    e = b.get("image_preprocess")
    if e and "error" not in e:
        ips, r = e["median_images_per_s"], e["platform_vs_plain"]
        add(f"8c. image preprocessing, {e['images']} JPEGs {e['side']}×{e['side']} "
            f"(~{e['mean_jpeg_bytes'] / 1000:.0f} KB) → 64×64 RGB, {e['workers']} processes", f"platform {_f(r)}× a plain Pillow process pool",
            f"platform (shard_images over the raw copy: decode, crop, resize, shards) {_f(ips['platform'], '{:,.0f}')}"
            f" images/s; the same with its pool's forkserver already running {_f(ips['platform_warm'], '{:,.0f}')}"
            f" images/s ({_f(e['platform_warm_vs_plain'])}×; starting that forkserver took "
            f"{_f(e['forkserver_start_s'])} s); plain (ProcessPoolExecutor, Pillow, one .npy) "
            f"{_f(ips['plain'], '{:,.0f}')} images/s; same pixels: {e['same_pixels']}", "≥ 0.8× plain script",
            r >= 0.8)
    e = b.get("image_memory")
    if e and "error" not in e:
        s, f = e["sizes"], [str(x) for x in e["factors"]]

        def mb(key: str) -> str:
            return "/".join(f"{s[x][key] / 2**20:.0f}" for x in f)
        g = e["growth_16x_vs_1x"]
        add(f"8d. image ingest memory (ingest + shard + checks), {'/'.join(str(s[x]['images']) for x in f)} JPEGs",
            f"peak process-tree RSS {_f(g['peak_tree_rss_bytes'])}× from 1× to 16×",
            f"peak MB of the tree (main, forkserver, workers): RSS {mb('peak_tree_rss_bytes')}; PSS "
            f"{mb('peak_tree_pss_bytes')} ({_f(g['peak_tree_pss_bytes'])}×); anonymous {mb('peak_tree_anon_bytes')} "
            f"({_f(g['peak_tree_anon_bytes'])}×); main process max RSS {mb('main_max_rss_bytes')}; s: "
            + "/".join(f"{s[x]['ingest_s'] + s[x]['shard_s']:.1f}" for x in f),
            "≤ 1.25× (flat)", g["peak_tree_rss_bytes"] <= 1.25)


def table(results: dict) -> str:
    b = results["benchmarks"]
    rows = []

    def add(figure: str, measured: str, side: str, target: str, ok: bool | None) -> None:
        rows.append(f"| {figure} | {measured} | {side} | {target} | {_met(ok)} |")

    for key in ("loaders", "gather"):
        if key not in b or "error" in b[key]:
            continue
        for label in sorted(b[key]["sizes"], key=lambda k: int(k.removesuffix("KB"))):
            e = b[key]["sizes"][label]
            vs = e.get("vs_memory_read_limit", {})
            med = e.get("median_samples_per_s", {})
            side = "; ".join([f"{k} {_f(med.get(k), '{:,.0f}')}/s ({_f(vs.get(k))}×)"
                              for k in ["memmap", "ours", "ours_before", *PEERS]
                              if k in med] + [f"{k}: not measured ({v[:120]})" for k, v in e["errors"].items()])
            ours = vs.get("ours")
            add(f"1{'' if key == 'loaders' else 'b'}. loader throughput{'' if key == 'loaders' else ' (gather re-run)'}, "
                f"{label} samples ({e['train_bytes'] / 2**20:.0f} MB)",
                f"ours {_f(ours)}× memory-read limit" + (f"; {_f(e['ours_vs_best_peer'], '{:.1f}')}× best peer "
                                                        f"({e['best_peer']})" if "ours_vs_best_peer" in e else ""),
                side, "≥ 0.5× limit" + ("; ≥ 10× best peer" if label == "4KB" and key == "loaders" else ""),
                None if ours is None else ours >= 0.5 and (label != "4KB" or e.get("ours_vs_best_peer", 99) >= 10))
    _typed_rows(b, add)
    _image_ingest_rows(b, add)
    if "stall" in b and "error" not in b["stall"]:
        s = b["stall"]
        add("2. data stall (4 KB, batch 256)", f"{s['stall_share'] * 100:.2f} % of step time",
            f"compute step {s['compute_step_s'] * 1000:.1f} ms; {s['loader']}; with the gather before "
            f"363bf0b {s['stall_share_before'] * 100:.2f} %; share of the wait spent on each epoch's first batch "
            f"{_f(s.get('first_batch_share_of_wait'))}; with num_workers=2 "
            f"{_f(s.get('stall_share_two_workers', float('nan')) * 100)} %", "≤ 2 %", s["stall_share"] <= 0.02)
    if "preprocess" in b and "error" not in b["preprocess"]:
        s = b["preprocess"]
        m = s["median_mb_per_s"]
        add(f"3. preprocessing, CSV → shards ({s['source_bytes'] / 2**20:.0f} MB CSV)",
            f"platform {_f(s['platform_vs_pyarrow'])}× pyarrow+numpy",
            f"platform (the assets' data path: chunks, Parquet copy, shards) {_f(m['platform'])} MB/s; "
            f"pyarrow+numpy {_f(m['pyarrow'])} MB/s; with the assets' GE raw suite {_f(m.get('platform_ge'))} MB/s "
            f"({_f(s.get('platform_ge_vs_pyarrow'))}×); whole-frame functions {_f(m.get('whole'))} MB/s "
            f"({_f(s.get('whole_vs_pyarrow'))}×); same shards: {s['same_shards']}",
            "≥ 0.5×", s["platform_vs_pyarrow"] >= 0.5)
    if "checkpoint" in b and "error" not in b["checkpoint"]:
        s = b["checkpoint"]
        t = s["median_s"]
        add(f"4a. checkpoint, sync save ({s['state_bytes'] / 2**20:.0f} MB state)",
            f"{_f(s['sync_vs_torch_save'])}× torch.save speed",
            f"torch.save {t['torch_save']:.3f} s; sync-mode save (training blocked until published; fsync "
            f"and pruning in the background) {t['sync_stall']:.3f} s; write_checkpoint fsynced before it "
            f"returns {t['sync_durable']:.3f} s ({_f(s['durable_vs_torch_save_fsync'])}× torch.save + fsync "
            f"{t['torch_save_fsync']:.3f} s)", "≥ 0.8×", s["sync_vs_torch_save"] >= 0.8)
        add("4b. checkpoint, async training stall", f"{_f(s['async_stall_vs_sync'], '{:.3f}')}× sync stall",
            f"async {t['async_stall']:.3f} s; sync {t['sync_stall']:.3f} s (one writer per mode across saves, "
            f"as in training)", "≤ 0.1×", s["async_stall_vs_sync"] <= 0.1)
    if "scaling" in b and "error" not in b["scaling"]:
        s = b["scaling"]
        m = s["median_samples_per_s"]
        add("5. scaling, 2 gloo ranks vs 1 (MLP 256→1024→1024→10, 256/rank, 1 thread/rank)",
            f"efficiency {_f(s['efficiency'])}", f"1 rank {_f(m['1'], '{:,.0f}')}/s; 2 ranks {_f(m['2'], '{:,.0f}')}/s; "
            f"the cores' own ceiling, two independent 1-rank runs at once: "
            f"{_f(m.get('2_independent'), '{:,.0f}')}/s (efficiency {_f(s.get('independent_efficiency'))})",
            "≥ 0.85", s["efficiency"] >= 0.85)
    if "guards" in b and "error" not in b["guards"]:
        s = b["guards"]
        add("5b. telemetry and guards, on vs off (2 gloo ranks, MLP 256→1024→1024→10, 256/rank)",
            f"{s['cost']:+.1%} step time", f"step {s['median_step_s']['on'] * 1000:.2f} ms on, "
            f"{s['median_step_s']['off'] * 1000:.2f} ms off (median of {len(s['runs']['on'])} runs each, alternated)",
            "≤ +1%", s["cost"] <= 0.01)
    if "overhead" in b and "error" not in b["overhead"]:
        s = b["overhead"]
        add(f"6. platform overhead ({s['epochs']} epochs, {s['source_bytes'] / 2**20:.0f} MB CSV)",
            f"{_f(s['platform_vs_plain'])}× plain script",
            f"pipeline {s['platform']['wall_s']:.1f} s; plain {s['plain']['wall_s']:.1f} s (its training "
            f"{s['plain']['train_s']:.1f} s)", "≤ 1.15×", s["platform_vs_plain"] <= 1.15)
        add("6b. run launch → first training step", f"{_f(s['launch_to_first_step_s'], '{:.1f}')} s",
            f"from job execution start {_f(s['execute_to_first_step_s'], '{:.1f}')} s; "
            f"step times {', '.join(f'{k.split(chr(46))[-1]} {v:.1f} s' for k, v in s['platform']['step_seconds'].items())}",
            "(reported)", None)
        tf = s["platform"].get("training_figures") or {}
        if tf.get("samples_per_second"):
            loop = tf["steps"] * 256 / tf["samples_per_second"]  # the recipe's global batch
            add("6c. inside the platform's training step", f"training loop {loop:.1f} s; checkpoint stalls "
                f"{tf.get('checkpoint_stall_s_total', float('nan')):.1f} s",
                f"checkpoint step {s['platform']['step_seconds'].get('bench_overhead__checkpoint', float('nan')):.1f} s "
                f"in all; plain script's training loop {s['plain']['train_s']:.1f} s; data wait share "
                f"{tf.get('data_wait_share', float('nan')):.3f}", "(reported)", None)
    if "growth" in b and "error" not in b["growth"]:
        s = b["growth"]
        for name, g in ((f"preprocessing (platform, {s.get('chunk_mb')} MB chunks)", s["preprocess"]["platform"]),
                        ("preprocessing (platform with GE raw suite)", s["preprocess"].get("platform_ge")),
                        ("preprocessing (whole-frame functions)", s["preprocess"].get("whole")),
                        ("loading (runtime loader)", s["load"])):
            if g is None:
                continue
            add(f"7. growth, {name}, 1×/4×/16×", f"time ∝ size^{g['exponent']:.2f}; working memory "
                f"{g['anon_growth_16x_vs_1x']:.1f}× from 1× to 16×",
                "s: " + "/".join(f"{g['seconds'][str(f)]:.2f}" for f in s["factors"]) + "; peak anonymous MB "
                "above the process' start: " + "/".join(f"{g['work_anon_mb'][str(f)]:.0f}" for f in s["factors"]),
                "exponent ≤ ~1.1; memory flat", g["exponent"] <= 1.1 and g["anon_growth_16x_vs_1x"] <= 1.5)
        lim = s["memory_limit"]
        env = " ".join(f"{k}={v}" for k, v in LIMITED_ENV.items())
        for how in PREPROCESS_PATHS:
            r = lim.get(how)
            if r is None:
                continue
            add(f"7b. {lim['source_bytes'] / 2**20:.0f} MB CSV under a {lim['limit_mb_above_imports']} MB "
                f"data limit ({how})", "completed" if r["ok"] else f"failed: {r.get('error', '')[:80]}",
                f"{r['seconds']:.1f} s; peak anonymous {r['work_anon_bytes'] / 2**20:.0f} MB above start; {env}",
                "completes",
                r["ok"])
    reruns = [f"`{name}` was re-run on its own with `{r['rerun']['command']}` at {r['rerun']['date']} "
              f"(load average after {r['rerun']['load_after']})" for name, r in b.items() if "rerun" in r]
    for name, r in b.items():
        if "error" in r:
            add(name, "not measured", r["error"][-200:].replace("|", "/").replace("\n", " "), "—", None)
    head = ["| figure | measured (ratio) | side by side (medians) | target | |", "| --- | --- | --- | --- | --- |"]
    m = results["machine"]
    meta = [f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, "
            f"Linux {m['kernel']}. Date: {results['date']}. Command: `{results['command']}` "
            f"(size {results['size']}, {results['wall_s'] / 60:.1f} min). Load average (1/5/15 min) before "
            f"{results['load_before']}, after {results['load_after']}: the cores were shared with other "
            "work, so absolute figures are noisy; each ratio compares runs made side by side in this run."]
    if reruns:
        meta.append("Re-runs: " + "; ".join(reruns) + ".")
    return "\n".join(meta + [""] + head + rows)


def write_report(results: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    md = out / "BENCHMARKS.md" if out != BENCH else REPO / "BENCHMARKS.md"
    block = f"{MARK_BEGIN}\n{table(results)}\n{MARK_END}"
    if md.exists() and MARK_BEGIN in md.read_text():
        text = md.read_text()
        pre, rest = text.split(MARK_BEGIN, 1)
        text = pre + block + rest.split(MARK_END, 1)[1]
    else:
        text = f"# Benchmarks\n\n{block}\n"
    md.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--only", choices=BENCHMARKS + EXTRA, action="append",
                    help="run only this benchmark (repeatable); other entries of results.json are kept")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers' venv and the peer loaders")
    ap.add_argument("--out", type=Path, default=BENCH,
                    help="where results.json goes (default benchmarks/; BENCHMARKS.md then goes to the repo root)")
    ap.add_argument("--data-dir", type=Path, default=DATA, help="generated data (default benchmarks/data)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    a.data_dir.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(a.size, a.data_dir.resolve(), peers=not a.no_peers)
    names = a.only or list(BENCHMARKS)
    prev = a.out / "results.json"
    results = json.loads(prev.read_text()) if a.only and prev.exists() else {"benchmarks": {}}
    t0 = time.perf_counter()
    command = " ".join(["python -m benchmarks.run", *(sys.argv[1:] if argv is None else argv)])
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rerun = bool(a.only) and "command" in results
    if not rerun:
        results.update(machine=machine(), date=date, command=command, size=a.size, load_before=load_average())
    if "loaders" in names or "image_loader" in names:
        ensure_peers(ctx)
    for name in names:
        t = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        try:
            results["benchmarks"][name] = {**RUNNERS[name](ctx), "bench_wall_s": time.perf_counter() - t}
            if rerun:
                results["benchmarks"][name]["rerun"] = {"command": command, "date": date, "load_after": load_average()}
        except Exception as e:  # recorded as not measured, with the reason; the other figures go on
            traceback.print_exc()
            results["benchmarks"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"[bench] {name} done in {time.perf_counter() - t:.0f} s", flush=True)
        if not rerun:
            results.update(load_after=load_average(), wall_s=time.perf_counter() - t0)
        write_report(results, a.out)
    print(table(results))
    return 0 if all("error" not in results["benchmarks"][n] for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
