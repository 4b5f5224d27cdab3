"""Typed-column (shard format v2) loader measurements, one per process, like benchmarks/loaders.py:
``python -m benchmarks.typed_loaders measure --loader NAME --data DIR`` prints one JSON line with
samples/s.

Images (``--data`` made by ``write-images``: 128x128 RGB JPEGs of about 20 KB, labels, ids):

- ``decoder``: the decoder alone, the ceiling: simplejpeg decoding the same JPEG bytes (read into
  memory first) in a plain loop on ``--threads`` threads, each into its own preallocated batch;
- ``ours``: the runtime's ``TypedLoader`` decoding on ``--threads`` threads into the batch;
- ``ours_augmented``: the same with a random 112x112 crop and horizontal flip;
- ``streaming`` / ``webdataset``: the peers over copies of the same JPEGs (``write-peers``, run in
  benchmarks/.peers-venv), decoding with the same library in ``--threads`` DataLoader workers.

Tokens (``write-tokens``: int32 windows of 129 tokens for language modelling):

- ``memmap``: the memory-read limit, as benchmarks/loaders.py measures it for v1: contiguous
  batch slices of the memory-mapped token column copied out, in shuffled batch order, one thread;
- ``ours``: the runtime's ``TypedLoader`` (shuffled samples, 2 loader threads as for v1).

Every loader: batch 256, page cache warmed first; the clock starts after the first two batches
and runs across epochs for ``--seconds``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.loaders import emit, time_epochs

BATCH = 256
IMAGE = (128, 128, 3)
CROP = (112, 112)
TOKENS = 129
SAMPLES_PER_SHARD = {"images": 2048, "tokens": 32768}  # shards of about 40 and 17 MB


# ---------------------------------------------------------------- data
def _synthetic_image(rng: np.random.Generator) -> np.ndarray:
    """A smooth colour field with grain: about 20 KB as a quality-90 JPEG at 128x128."""
    low = rng.integers(0, 256, (8, 8, 3)).astype(np.float32)
    img = np.kron(low, np.ones((16, 16, 1), np.float32))
    for _ in range(3):
        img = (img + np.roll(img, 1, 0) + np.roll(img, 1, 1) + np.roll(img, -1, 0) + np.roll(img, -1, 1)) / 5
    img += rng.normal(0, 24, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _write_v2(out: Path, columns, samples_of, total: int, per_shard: int) -> dict:
    """v2 shards in out/shards (train split only), ``samples_of(start, n)`` making each shard's values."""
    from training_runtime.data.shard_format import FORMAT_V2, ShardWriter

    manifest_path = out / "shards" / "manifest.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    tmp = out / "shards.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    writer, entries = ShardWriter(columns), []
    for s, start in enumerate(range(0, total, per_shard)):
        rel = f"train/{s:05d}.bin"
        entries.append(writer.write(tmp / rel, rel, samples_of(start, min(per_shard, total - start))))
    manifest = {"format": FORMAT_V2, "columns": [c.to_dict() for c in columns],
                "splits": {"train": {"num_samples": total, "shards": entries}}}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(out / "shards", ignore_errors=True)
    tmp.rename(out / "shards")
    return manifest


def write_images(out: Path, images: int, seed: int = 0) -> dict:
    import simplejpeg

    from training_runtime.data.shard_format import Column

    rng = np.random.default_rng(seed)
    columns = [Column("jpeg", "bytes", "input"), Column("label", "ndarray", "target", "int64"),
               Column("id", "str", "id")]

    def samples(start: int, n: int) -> dict:
        return {"jpeg": [simplejpeg.encode_jpeg(_synthetic_image(rng), quality=90) for _ in range(n)],
                "label": rng.integers(0, 10, n), "id": [f"img{start + i:08d}" for i in range(n)]}
    man = _write_v2(out, columns, samples, images, SAMPLES_PER_SHARD["images"])
    return {"samples": man["splits"]["train"]["num_samples"], **_shard_bytes(out)}


def write_tokens(out: Path, windows: int, seed: int = 0) -> dict:
    from training_runtime.data.shard_format import Column

    rng = np.random.default_rng(seed)
    columns = [Column("tokens", "ndarray", "input", "int32", (TOKENS,))]

    def samples(start: int, n: int) -> dict:
        return {"tokens": rng.integers(0, 50_257, (n, TOKENS), dtype=np.int32)}
    man = _write_v2(out, columns, samples, windows, SAMPLES_PER_SHARD["tokens"])
    return {"samples": man["splits"]["train"]["num_samples"], **_shard_bytes(out)}


def _shard_bytes(out: Path) -> dict:
    return {"shard_bytes": sum(p.stat().st_size for p in (out / "shards").rglob("*.bin"))}


def _open(data: Path):
    from training_runtime.data.loader import TypedSplit

    man = json.loads((data / "shards" / "manifest.json").read_text())
    paths = [data / "shards" / s["path"] for s in man["splits"]["train"]["shards"]]
    return TypedSplit(man, paths, "train")


def read_jpegs(data: Path) -> tuple[list[bytes], np.ndarray]:
    split = _open(data)
    g = split.gather(np.arange(split.num_samples), ["jpeg", "label"])
    return g["jpeg"], g["label"]


# ---------------------------------------------------------------- loaders (epoch -> batches)
def ours_images(data: Path, threads: int, seed: int, augment: bool = False):
    import torch

    from training_runtime.data.sampling import epoch_indices
    from training_runtime.data.augment import ImageAugment
    from training_runtime.data.decode import ImageDecoder
    from training_runtime.data.loader import TypedLoader

    split = _open(data)
    aug = {"jpeg": ImageAugment(crop=CROP)} if augment else {}
    # One decode pool for all epochs, as a training loop keeps one: chained epochs overlap, and
    # a pool per epoch would then decode on twice the threads the decoder alone gets.
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shard-decode")

    def make_loader(e: int, first: int) -> TypedLoader:
        idx = epoch_indices(split.num_samples, 1, 0, e, seed)
        return TypedLoader(split, idx, BATCH, first, torch.device("cpu"), epoch=e, seed=seed,
                           decoders={"jpeg": ImageDecoder(*IMAGE[:2])}, augment=aug, num_workers=2,
                           decode_threads=threads, pool=pool)
    return _chained(make_loader, split.num_samples, "jpeg", "label")


def ours_tokens(data: Path, threads: int, seed: int):
    import torch

    from training_runtime.data.sampling import epoch_indices
    from training_runtime.data.loader import TypedLoader

    split = _open(data)

    def make_loader(e: int, first: int) -> TypedLoader:
        idx = epoch_indices(split.num_samples, 1, 0, e, seed)
        return TypedLoader(split, idx, BATCH, first, torch.device("cpu"), epoch=e, seed=seed, num_workers=2)
    return _chained(make_loader, split.num_samples, "tokens", "tokens")


def _chained(make_loader, num_samples: int, x: str, y: str):
    """Epochs chained as the trainer chains them (each epoch's loader starts the next one's);
    ``measure`` sees one endless epoch."""
    from training_runtime.data.prefetch import chained_epochs

    def epoch(e: int):
        if e:
            raise RuntimeError("chained epochs never end")
        per_epoch = -(-num_samples // BATCH)
        for _, loader in chained_epochs(make_loader, 0, per_epoch, 10**9):
            for b in loader:
                yield b[x], b[y]
    return epoch


def memmap_tokens(data: Path, threads: int, seed: int):
    """The memory-read limit, measured as benchmarks/loaders.py measures it for v1: contiguous
    batch slices of each shard's memory-mapped token block copied out, in shuffled batch order."""
    man = json.loads((data / "shards" / "manifest.json").read_text())
    maps = []
    for s in man["splits"]["train"]["shards"]:
        block = s["columns"]["tokens"]
        maps.append(np.memmap(data / "shards" / s["path"], dtype="<i4", mode="r", offset=block["offset"],
                              shape=(s["num_samples"], TOKENS)))
    slices = [(x, s) for x in maps for s in range(0, len(x), BATCH)]

    def epoch(e: int):
        for k in np.random.default_rng([seed, e]).permutation(len(slices)):
            x, s = slices[k]
            batch = np.array(x[s:s + BATCH])
            yield batch, batch
    return epoch


def measure_decoder(data: Path, seconds: float, threads: int, seed: int = 0) -> dict:
    """simplejpeg on ``threads`` threads, each decoding every threads-th JPEG of a shuffled order
    into its own preallocated batch, in a plain loop; the clock covers all threads together."""
    import simplejpeg

    jpegs, _ = read_jpegs(data)
    order = np.random.default_rng(seed).permutation(len(jpegs)).tolist()
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        out = np.empty((BATCH, *IMAGE), np.uint8)
        mine = order[t::threads]
        start.wait()
        k = 0
        while not stop.is_set():
            simplejpeg.decode_jpeg(jpegs[mine[k % len(mine)]], colorspace="RGB", buffer=out[k % BATCH])
            k += 1
            counts[t] = k
    workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    time.sleep(0.2)  # the same warm-up role as the loaders' first two batches
    c0, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    c1, dt = sum(counts), time.perf_counter() - t0
    stop.set()
    for w in workers:
        w.join()
    return {"loader": "decoder", "samples": c1 - c0, "seconds": dt, "samples_per_s": (c1 - c0) / dt,
            "threads": threads}


def _peer_decode():
    """The peers decode with the same library as ours (simplejpeg) when it is installed there."""
    try:
        import simplejpeg
    except ImportError:
        from PIL import Image
        import io

        return "pillow", lambda b: np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
    return "simplejpeg", lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB")


def streaming_images(data: Path, threads: int, seed: int):
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    _, decode = _peer_decode()

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return torch.from_numpy(decode(s["jpeg"])), int(s["label"])

    ds = Decoded(local=str(data / "mds"), remote=None, shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=threads, persistent_workers=True)

    def epoch(e: int):
        yield from dl
    return epoch


def webdataset_images(data: Path, threads: int, seed: int):
    import torch
    import webdataset as wds

    _, decode = _peer_decode()
    urls = sorted(str(p) for p in (data / "wds").glob("*.tar"))

    def sample(s):
        return torch.from_numpy(decode(s["jpg"])), int(s["cls"])

    ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False,
                         nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
          .shuffle(1000).map(sample).batched(BATCH))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=threads, persistent_workers=True)

    def epoch(e: int):
        yield from dl
    return epoch


IMAGE_LOADERS = {"ours": ours_images, "ours_augmented": lambda d, t, s: ours_images(d, t, s, augment=True),
                 "streaming": streaming_images, "webdataset": webdataset_images}
IMAGE_CHOICES = [*IMAGE_LOADERS, "decoder"]  # the decoder alone is measured by measure_decoder
TOKEN_LOADERS = {"ours": ours_tokens, "memmap": memmap_tokens}


def _warm(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(8 << 20):
                    pass


def measure(kind: str, loader: str, data: Path, seconds: float, threads: int, seed: int = 0) -> dict:
    _warm(data / {"streaming": "mds", "webdataset": "wds"}.get(loader, "shards"))
    if kind == "images" and loader == "decoder":
        return measure_decoder(data, seconds, threads, seed)
    epoch_fn = (IMAGE_LOADERS if kind == "images" else TOKEN_LOADERS)[loader](data, threads, seed)
    samples, batches, dt, e = time_epochs(loader, epoch_fn, seconds)
    out = {"loader": loader, "samples": samples, "batches": batches, "seconds": dt, "epochs_started": e,
           "samples_per_s": samples / dt, "threads": threads}
    if loader in ("streaming", "webdataset"):
        out["decoder"] = _peer_decode()[0]
    return out


# ---------------------------------------------------------------- peer formats
def write_peers(data: Path) -> dict:
    """MDS (MosaicML streaming) and webdataset tar copies of the JPEGs and labels."""
    jpegs, labels = read_jpegs(data)
    out = {}
    mds = data / "mds"
    if not (mds / "index.json").exists():
        from streaming import MDSWriter

        shutil.rmtree(mds, ignore_errors=True)
        with MDSWriter(out=str(mds), columns={"jpeg": "bytes", "label": "int64"}, size_limit=1 << 26) as w:
            for b, y in zip(jpegs, labels):
                w.write({"jpeg": b, "label": np.int64(y)})
    out["mds_bytes"] = sum(p.stat().st_size for p in mds.rglob("*") if p.is_file())
    wdir = data / "wds"
    if not (wdir / ".complete").exists():
        import webdataset as wds

        shutil.rmtree(wdir, ignore_errors=True)
        wdir.mkdir(parents=True)
        with wds.ShardWriter(str(wdir / "shard-%05d.tar"), maxsize=1 << 26, verbose=0) as w:
            for i, (b, y) in enumerate(zip(jpegs, labels)):
                w.write({"__key__": f"{i:08d}", "jpg": b, "cls": str(int(y))})
        (wdir / ".complete").touch()
    out["wds_bytes"] = sum(p.stat().st_size for p in wdir.glob("*.tar"))
    out["samples"] = len(jpegs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.typed_loaders")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--kind", choices=["images", "tokens"], required=True)
    m.add_argument("--loader", required=True)
    m.add_argument("--data", type=Path, required=True)
    m.add_argument("--seconds", type=float, default=2.0)
    m.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    wi = sub.add_parser("write-images")
    wi.add_argument("--data", type=Path, required=True)
    wi.add_argument("--images", type=int, required=True)
    wt = sub.add_parser("write-tokens")
    wt.add_argument("--data", type=Path, required=True)
    wt.add_argument("--windows", type=int, required=True)
    wp = sub.add_parser("write-peers")
    wp.add_argument("--data", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "measure":
        loaders = IMAGE_CHOICES if a.kind == "images" else list(TOKEN_LOADERS)
        if a.loader not in loaders:
            ap.error(f"--loader must be one of {sorted(loaders)} for --kind {a.kind}")
        result = measure(a.kind, a.loader, a.data, a.seconds, a.threads)
    elif a.cmd == "write-images":
        result = write_images(a.data, a.images)
    elif a.cmd == "write-tokens":
        result = write_tokens(a.data, a.windows)
    else:
        result = write_peers(a.data)
    emit(result)


if __name__ == "__main__":
    sys.exit(main())
