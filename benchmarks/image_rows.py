"""The image-ingest rows of the benchmark table (figures 8c, 8d and 8e): the shards asset's image
path against a plain Pillow process pool, and the memory and time of ingest as an image folder
grows 1× → 4× → 16×. The measurements are benchmarks/image_ingest.py's. ``RUNNERS`` measure;
``render`` turns results.json's entries into rows."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.common import fit_exponent, median, rotate, run_json
from benchmarks.harness import Ctx, Rows, fmt, measured

# ---------------------------------------------------------------- 8c/8d. image ingest
IMAGE_GROWTH = (1, 4, 16)  # 8d/8e: the folder's size, as a share of 16 (every 16th, 4th, every file)


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
    # 8e: the same runs' ingest + shard + check time against the folder's size
    seconds = {k: v["ingest_s"] + v["shard_s"] for k, v in sizes.items()}
    exponent = fit_exponent([float(sizes[str(f)]["images"]) for f in IMAGE_GROWTH], [seconds[str(f)] for f in IMAGE_GROWTH])
    return {**written, "factors": list(IMAGE_GROWTH), "sizes": sizes, "growth_16x_vs_1x": growth,
            "tree_rss_16x_vs_1x": growth["peak_tree_rss_bytes"], "seconds": seconds, "time_exponent": exponent}


def bench_image_growth(ctx: Ctx) -> dict:
    """8f: an ingest of the folder with 1 % more images, built on the previous version's parts,
    against a full ingest of the folder; ``reps`` times, each in a fresh process."""
    data, written = _image_folder(ctx)
    runs = [run_json([ctx.py, "-m", "benchmarks.image_ingest", "grow", "--data", str(data), "--share", "0.01"],
                     timeout=ctx.p["timeout"]) for _ in range(ctx.p["reps"])]
    return {**written, "runs": runs, "added": runs[0]["added"],
            "median_full_s": median([r["full_s"] for r in runs]), "median_grown_s": median([r["grown_s"] for r in runs]),
            "grown_vs_full": median([r["grown_vs_full"] for r in runs])}


def render(b: dict, rows: Rows) -> None:
    """Rows 8c, 8d and 8e of ``b`` (results.json's ``benchmarks``)."""
    e = b.get("image_preprocess")
    if measured(e):
        ips, r = e["median_images_per_s"], e["platform_vs_plain"]
        rows.add(f"8c. image preprocessing, {e['images']} JPEGs {e['side']}×{e['side']} "
                 f"(~{e['mean_jpeg_bytes'] / 1000:.0f} KB) → 64×64 RGB, {e['workers']} processes",
                 f"platform {fmt(r)}× a plain Pillow process pool",
                 f"platform (shard_images over the raw copy: decode, crop, resize, shards) {fmt(ips['platform'], '{:,.0f}')}"
                 f" images/s; the same with its pool's forkserver already running {fmt(ips['platform_warm'], '{:,.0f}')}"
                 f" images/s ({fmt(e['platform_warm_vs_plain'])}×; starting that forkserver took "
                 f"{fmt(e['forkserver_start_s'])} s); plain (ProcessPoolExecutor, Pillow, one .npy) "
                 f"{fmt(ips['plain'], '{:,.0f}')} images/s; same pixels: {e['same_pixels']}", "≥ 0.8× plain script",
                 r >= 0.8)
    e = b.get("image_memory")
    if measured(e):
        s, f = e["sizes"], [str(x) for x in e["factors"]]

        def mb(key: str) -> str:
            return "/".join(f"{s[x][key] / 2**20:.0f}" for x in f)
        g = e["growth_16x_vs_1x"]
        rows.add(f"8d. image ingest memory (ingest + shard + checks), {'/'.join(str(s[x]['images']) for x in f)} JPEGs",
                 f"peak process-tree RSS {fmt(g['peak_tree_rss_bytes'])}× from 1× to 16×",
                 f"peak MB of the tree (main, forkserver, workers): RSS {mb('peak_tree_rss_bytes')}; PSS "
                 f"{mb('peak_tree_pss_bytes')} ({fmt(g['peak_tree_pss_bytes'])}×); anonymous {mb('peak_tree_anon_bytes')} "
                 f"({fmt(g['peak_tree_anon_bytes'])}×); main process max RSS {mb('main_max_rss_bytes')}; s: "
                 + "/".join(f"{s[x]['ingest_s'] + s[x]['shard_s']:.1f}" for x in f),
                 "≤ 1.25× (flat)", g["peak_tree_rss_bytes"] <= 1.25, how="each size once, in its own process")
        if "time_exponent" in e:
            t = e["seconds"]
            rows.add(f"8e. image-folder ingest time (ingest + shard + checks), {'/'.join(str(s[x]['images']) for x in f)} "
                     "JPEGs", f"time ∝ size^{e['time_exponent']:.2f} from 1× to 16×",
                     "s: " + "/".join(f"{t[x]:.1f}" for x in f) + f" ({fmt(t[f[-1]] / t[f[0]], '{:.1f}')}× for 16× the "
                     "images); each size once, in its own process, its worker pool's start included",
                     "exponent ≤ 1.1 (close to linear)", e["time_exponent"] <= 1.1,
                     how="each size once, in order (the same runs as 8d)")


    e = b.get("image_growth")
    if measured(e):
        r = e["grown_vs_full"]
        rows.add(f"8f. image-folder ingest of +1 % ({e['added']} JPEGs added to {e['images']}), built on the "
                 "previous version's parts", f"{fmt(r)}× a full ingest's time",
                 f"s: full ingest + shard + checks {fmt(e['median_full_s'])}, the edit {fmt(e['median_grown_s'])} "
                 "(every file hashed and listed, the kept part's rows through the suite, the new images decoded "
                 "and sharded)", "≤ 0.10× a full ingest", r <= 0.10, how="median of reps, each pair in one process")


RUNNERS = {"image_preprocess": bench_image_preprocess, "image_memory": bench_image_memory,
           "image_growth": bench_image_growth}
