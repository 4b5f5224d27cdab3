"""Image ingest, figures 8c and 8d: ``python -m benchmarks.image_ingest <command> ...``.

8c, preprocessing speed. The same folder of ~17 KB JPEGs (``pipelines.models.shapes.draw_shape``
at 96x96, saved as the shapes example saves them), to 64x64 RGB samples on ``os.cpu_count()``
processes, two ways (``measure --how``):

- ``platform``: what the shards asset runs, ``assets.kinds.image_shards.shard_images`` over the
  raw copy that ingest wrote (made once beforehand, not timed): read row group by row group,
  split by id, decode + center crop + resize on its forkserver pool, shards written with
  checksums;
- ``platform_warm``: the same, in a process whose pool forkserver is already running (started
  by a trivial task first, untimed), as it is when ingest ran in the same process before: the
  platform's path without the start-up of its pool;
- ``plain``: a plain Pillow script: ``ProcessPoolExecutor(os.cpu_count())`` mapping
  ``Image.open(path).convert("RGB")`` + the same center crop and bilinear resize + ``np.asarray``
  over the files (in slices of 64, as the platform's tasks), then one ``.npy`` of all the arrays.

The clock covers everything after imports and the spec (built first, as Dagster builds it when it
loads the definitions): starting the pool, reading, decoding, writing. Both
sides hash their pixels in id order afterwards (not timed), so the report says whether they made
the same samples.

8d, memory as the folder grows. ``memory --stride k`` runs ``ingest`` (the raw_dataset asset's
``ingest_images``, then the shards asset's ``shard_images`` and ``check_image_shards``, on every
core, without the store and Dagster) in a child process over every k-th file of the folder, and
samples the whole process tree (the child, its forkserver and the pool workers) every 50 ms from
/proc: the sum of their RSS, PSS (shared pages divided among the processes that map them) and
anonymous memory. The child's own maximum RSS comes from ``getrusage`` as well (exact, between
samples).

8f, an edit against a whole ingest. ``grow --share 0.01`` times a full ingest of the folder,
then the ingest of the folder with 1 % more images that builds on the first one's parts
(``grow``'s docstring).

``write --images N`` draws the folder (once; classes circle/square/triangle in turn) and ingests
the raw copy that the platform side of 8c starts from.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.common import REPO, emit

SIDE = 96  # the shapes example's images: about 17 KB each as it saves them
SAMPLE = (64, 64)  # (height, width) of every preprocessed sample
CLASSES = ("circle", "square", "triangle")
FOLDER = "shapes"
PLAIN_CHUNK = 64  # images per task of the plain pool: the platform's MAX_IMAGES_PER_TASK
SAMPLE_EVERY_S = 0.05
HOWS = ("platform", "platform_warm", "plain")  # the sides of 8c


# ---------------------------------------------------------------- data
def write_folder(data: Path, images: int, seed: int = 0) -> dict:
    """``images`` JPEGs in ``data/shapes/<class>/``, the classes in turn; drawn once (a marker
    file says the folder is whole)."""
    from pipelines.models.shapes import JPEG_QUALITY, draw_shape

    folder, done = data / FOLDER, data / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        rng = np.random.default_rng(seed)
        for i in range(images):
            kind = CLASSES[i % len(CLASSES)]
            path = folder / kind / f"{kind}-{i:06d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            draw_shape(kind, rng, SIDE).save(path, "JPEG", quality=JPEG_QUALITY, subsampling=0)
        done.touch()
    files = image_files(data)
    raw_copy(data)  # here, so that the platform's first timed run does not make it
    return {"images": len(files), "side": SIDE, "mean_jpeg_bytes": sum(f.stat().st_size for f in files) / len(files)}


def image_files(data: Path) -> list[Path]:
    """The folder's files as the raw_dataset asset lists them (``rglob``, sorted)."""
    return sorted(p for p in (data / FOLDER).rglob("*") if p.is_file())


def image_spec():
    from core.spec import ImageFolder, ImagePreprocessing, dataset_pipeline

    return dataset_pipeline("bench_images", source=ImageFolder(root=FOLDER), classes=CLASSES,
                            preprocessing=ImagePreprocessing(size=SAMPLE))


def _warm(paths: list[Path]) -> None:
    for p in paths:
        p.read_bytes()


def raw_copy(data: Path) -> Path:
    """The raw copy ingest writes (a directory: ``parts.json`` and the parts), made once for the
    platform side of 8c."""
    from assets.kinds.image_ingest import ingest_images

    out = data / "raw" / "image-parts"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        raw = ingest_images(image_spec(), image_files(data), data, tmp)
        if not raw.report.passed:
            raise RuntimeError(f"ingest refused the benchmark's images: {raw.report.failures[:3]}")
        tmp.rename(out)
    return out


# ---------------------------------------------------------------- 8c: the two sides
def plain_pixels(path: Path) -> np.ndarray:
    """The plain script's work on one file: decode, center crop to a square, bilinear resize."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    side = min(w, h)
    box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
    return np.asarray(img.resize(SAMPLE[::-1], Image.Resampling.BILINEAR, box=box))


def run_plain(files: list[Path], out: Path, workers: int) -> np.ndarray:
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        pixels = np.stack(list(pool.map(plain_pixels, files, chunksize=PLAIN_CHUNK)))
    np.save(out / "images.npy", pixels)
    return pixels


def start_forkserver(workers: int) -> None:
    """Start the platform pool's forkserver (it imports the worker modules once, then stays up for
    this process) with a trivial task, as the ingest that precedes sharding does."""
    from assets.kinds.image_pool import WorkerPool

    with WorkerPool(workers) as pool:
        list(pool.ordered(abs, [(None, -1)]))


def run_platform(spec, raw: Path, out: Path, workers: int) -> dict:
    from assets.kinds.image_shards import shard_images

    return shard_images(spec, raw, out / "shards", workers)


def _digest(ids: list[str], pixels) -> str:
    """sha256 of the samples in id order."""
    h = hashlib.sha256()
    for i in np.argsort(np.array(ids, dtype=object), kind="stable"):
        h.update(np.ascontiguousarray(pixels[i]).data)
    return h.hexdigest()


def _platform_samples(manifest: dict, out: Path) -> tuple[list[str], list[np.ndarray]]:
    from training_runtime.data.shard_format import ShardColumns, columns_from_manifest

    columns = columns_from_manifest(manifest)
    ids, pixels = [], []
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            shard = ShardColumns(out / "shards" / entry["path"], entry, columns)
            ids += [shard.value("id", i).decode() for i in range(shard.num_samples)]
            pixels += list(np.array(shard.arrays["image"]))
    return ids, pixels


def pin_cpus(cpus: int) -> list[int]:
    """Keep this process (and the pool it starts) to the first ``cpus`` CPUs it may use, as a pod
    with ``cpus`` CPUs would be kept; the pool's default size follows (image_pool.default_workers)."""
    allowed = sorted(os.sched_getaffinity(0))
    if cpus > len(allowed):
        raise SystemExit(f"--cpus {cpus}: this process may use only {len(allowed)} CPU(s) ({allowed})")
    os.sched_setaffinity(0, allowed[:cpus])
    return allowed[:cpus]


def measure(how: str, data: Path, workers: int | None) -> dict:
    """One side of 8c (``workers`` processes), or, with ``workers`` None, the platform's default
    pool for the CPUs this process may use (10d)."""
    if workers is None:
        from assets.kinds.image_pool import default_workers

        workers = default_workers()
    files = image_files(data)
    raw = raw_copy(data) if how != "plain" else None
    # built before the clock, as Dagster builds it when it loads the definitions: building a spec
    # (its checks) is the definitions' work, not the shards asset's
    spec = image_spec() if how != "plain" else None
    if spec is not None:
        import assets.kinds.image_shards  # noqa: F401  (imported before the clock, as the plain side's Pillow is)
    _warm(sorted(p for p in raw.rglob("*.parquet")) if raw is not None else files)  # both from the page cache
    pool_start_s = None
    if how == "platform_warm":
        started = time.perf_counter()
        start_forkserver(workers)
        pool_start_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(dir=data, prefix=f"{how}-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        if how != "plain":
            manifest = run_platform(spec, raw, out, workers)
            seconds = time.perf_counter() - t0
            ids, pixels = _platform_samples(manifest, out)
        else:
            pixels = run_plain(files, out, workers)
            seconds = time.perf_counter() - t0
            ids = [f.relative_to(data / FOLDER).as_posix() for f in files]
        written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"how": how, "images": len(ids), "seconds": seconds, "images_per_s": len(ids) / seconds,
            "workers": workers, "bytes_written": written, "digest": _digest(ids, pixels),
            "forkserver_start_s": pool_start_s}


# ---------------------------------------------------------------- 8d: ingest in a child, memory of its tree
def ingest(data: Path, stride: int, work: Path) -> dict:
    """raw_dataset's ingest, then the shards asset's sharding and checks, over every
    ``stride``-th file, on every core: what the two assets do with an image folder."""
    from assets.kinds.image_checks import check_image_shards
    from assets.kinds.image_ingest import ingest_images
    from assets.kinds.image_shards import shard_images

    spec, files = image_spec(), image_files(data)[::stride]
    t0 = time.perf_counter()
    raw = ingest_images(spec, files, data, work / "images.parquet")
    t1 = time.perf_counter()
    manifest = shard_images(spec, raw.path, work / "shards")
    report = check_image_shards(spec, manifest, work / "shards")
    t2 = time.perf_counter()
    return {"images": len(files), "accepted": raw.rows, "raw_passed": raw.report.passed,
            "shards_passed": report.passed, "ingest_s": t1 - t0, "shard_s": t2 - t1,
            "samples": sum(s["num_samples"] for s in manifest["splits"].values())}


def _rollup(pid: int) -> dict[str, int] | None:
    """Rss, Pss and Anonymous bytes of one process (/proc/<pid>/smaps_rollup); None once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines)
    return {k: int(fields.get(k, "0 kB").split()[0]) * 1024 for k in ("Rss", "Pss", "Anonymous")}


def _tree_memory(pid: int) -> tuple[int, int, int, int, int]:
    """(rss, pss, anonymous) summed over ``pid`` and its descendants, the main process's rss,
    and how many processes; a process that exits between listing and reading is left out."""
    import psutil

    try:
        pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return 0, 0, 0, 0, 0
    found = {p: m for p in pids if (m := _rollup(p)) is not None}
    total = {k: sum(m[k] for m in found.values()) for k in ("Rss", "Pss", "Anonymous")}
    return total["Rss"], total["Pss"], total["Anonymous"], found.get(pid, {}).get("Rss", 0), len(found)


def measure_memory(data: Path, stride: int) -> dict:
    """``ingest`` in a child process; the peaks of its tree, sampled every SAMPLE_EVERY_S."""
    with tempfile.TemporaryDirectory(dir=data, prefix="ingest-") as work:
        cmd = [sys.executable, "-m", "benchmarks.image_ingest", "ingest", "--data", str(data),
               "--stride", str(stride), "--work", work]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        peak = dict.fromkeys(("rss", "pss", "anon", "main_rss", "processes"), 0)
        samples = 0
        while child.poll() is None:
            for key, value in zip(peak, _tree_memory(child.pid)):
                peak[key] = max(peak[key], value)
            samples += 1
            time.sleep(SAMPLE_EVERY_S)
        stdout, stderr = child.communicate()
        wall = time.perf_counter() - t0
    if child.returncode != 0:
        raise RuntimeError(f"ingest exited {child.returncode}: {stderr[-1500:]}")
    result = json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])
    # ru_maxrss of the reaped children, in KiB on Linux: the ingest process (this process has no other children)
    child_max = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {**result, "stride": stride, "wall_s": wall, "samples_taken": samples,
            "peak_tree_rss_bytes": peak["rss"], "peak_tree_pss_bytes": peak["pss"],
            "peak_tree_anon_bytes": peak["anon"], "peak_main_rss_bytes": peak["main_rss"],
            "main_max_rss_bytes": child_max, "max_processes": peak["processes"]}


def grow(data: Path, share: float, work: Path) -> dict:
    """8f: what an edit of the folder costs against making it whole. A full ingest (raw_dataset's
    ``ingest_images`` with every file hashed, the shards asset's ``shard_images`` and
    ``check_image_shards``) of every file; then the same three on the folder with ``share`` more
    images (copies of its first files under new names, in their class folders), building on the
    first version's parts as a run does when only the files changed. Both on every core, both
    timed from the listing to the checked shards."""
    from assets.kinds.image_checks import check_image_shards
    from assets.kinds.image_ingest import PreviousParts, ingest_images
    from assets.kinds.image_parts import INDEX_NAME, read_index
    from assets.kinds.image_shards import shard_images

    spec, files = image_spec(), image_files(data)
    root = work / "root"
    for f in files:  # hard links: the folder as it is, without copying it
        (root / f.relative_to(data)).parent.mkdir(parents=True, exist_ok=True)
        os.link(f, root / f.relative_to(data))
    before = image_files(root)

    def timed(listed: list[Path], out: Path, previous: PreviousParts | None, manifest: dict | None):
        t0 = time.perf_counter()
        raw = ingest_images(spec, listed, root, out / "raw", salt="bench", previous=previous)
        made = shard_images(spec, out / "raw", out / "shards", previous=manifest)
        report = check_image_shards(spec, made, out / "shards")
        if not (raw.report.passed and report.passed):
            raise RuntimeError(f"ingest refused the benchmark's images: {(raw.report.failures + report.failures)[:3]}")
        return time.perf_counter() - t0, raw, made

    full_s, first, manifest = timed(before, work / "full", None, None)
    added = max(1, round(len(before) * share))
    for i, f in enumerate(before[:added]):
        shutil.copyfile(f, f.with_name(f"grown-{i:06d}{f.suffix}"))
    kept = read_index((work / "full" / "raw" / INDEX_NAME).read_bytes())["parts"]

    def rows(part: dict) -> Path:  # as the store's download would: a copy the ingest may delete
        copy = work / "previous" / part["rows_table"]
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work / "full" / "raw" / part["rows_table"], copy)
        return copy

    grown_s, second, grown = timed(image_files(root), work / "grown", PreviousParts({p["key"]: p for p in kept}, rows),
                                   manifest)
    return {"images": len(before), "added": added, "full_s": full_s, "grown_s": grown_s,
            "grown_vs_full": grown_s / full_s, "parts": second.parts,
            "samples": sum(s["num_samples"] for s in grown["splits"].values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.image_ingest")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="draw the JPEG folder and ingest its raw copy (once)")
    w.add_argument("--data", type=Path, required=True)
    w.add_argument("--images", type=int, required=True)
    m = sub.add_parser("measure", help="8c: one side's images/s")
    m.add_argument("--how", choices=HOWS, required=True)
    m.add_argument("--data", type=Path, required=True)
    m.add_argument("--workers", type=int, default=None,
                   help="processes in the pool (default: the platform's, one per CPU this process may use)")
    m.add_argument("--cpus", type=int, default=None, help="10d: run on the first N CPUs only (as an N-CPU pod)")
    mem = sub.add_parser("memory", help="8d: ingest every stride-th file in a child; its tree's peak memory")
    mem.add_argument("--data", type=Path, required=True)
    mem.add_argument("--stride", type=int, required=True)
    i = sub.add_parser("ingest", help="(the child of memory) ingest, shard and check")
    i.add_argument("--data", type=Path, required=True)
    i.add_argument("--stride", type=int, required=True)
    i.add_argument("--work", type=Path, required=True)
    g = sub.add_parser("grow", help="8f: a full ingest, then one of the folder with --share more images")
    g.add_argument("--data", type=Path, required=True)
    g.add_argument("--share", type=float, default=0.01)
    a = ap.parse_args(argv)
    if a.cmd == "write":
        emit(write_folder(a.data, a.images))
    elif a.cmd == "measure":
        pinned = pin_cpus(a.cpus) if a.cpus else None
        emit({**measure(a.how, a.data, a.workers), "cpus": pinned})
    elif a.cmd == "memory":
        emit(measure_memory(a.data, a.stride))
    elif a.cmd == "grow":
        with tempfile.TemporaryDirectory(dir=a.data.parent, prefix="grow-") as work:
            emit(grow(a.data, a.share, Path(work)))
    else:
        emit(ingest(a.data, a.stride, a.work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
