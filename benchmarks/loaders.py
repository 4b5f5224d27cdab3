"""One loader measurement per process: ``python -m benchmarks.loaders measure --loader NAME --data DIR``
prints one JSON line with samples/s. ``ours`` and ``memmap`` run in the platform's .venv; ``streaming``,
``webdataset`` and ``pandas`` run in benchmarks/.peers-venv against the same samples (``write-peers``,
also run there, writes the MDS and tar copies of the platform's train shards).

Every loader: batch 256, shuffled, page cache warmed by reading every file first; the clock starts
after the first two batches (worker start-up excluded for all) and runs across epochs for
``--seconds`` (a partial last epoch counts its samples)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

BATCH = 256


def _manifest(data: Path) -> dict:
    return json.loads((data / "shards" / "manifest.json").read_text())


def _train_files(data: Path) -> list[tuple[Path, int]]:
    man = _manifest(data)
    return [(data / "shards" / s["path"], s["num_samples"]) for s in man["splits"]["train"]["shards"]]


def read_train_arrays(data: Path) -> tuple[np.ndarray, np.ndarray]:
    """All train samples of the platform's shards (layout: features float32, then labels int64)."""
    man = _manifest(data)
    dim = math.prod(man["feature_shape"])
    xs, ys = [], []
    for path, n in _train_files(data):
        raw = np.fromfile(path, dtype=np.uint8)
        xs.append(raw[: n * dim * 4].view("<f4").reshape(n, dim))
        ys.append(raw[n * dim * 4:].view("<i8"))
    return np.concatenate(xs), np.concatenate(ys)


def warm_page_cache(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(8 << 20):
                    pass


# ---------------------------------------------------------------- loaders (epoch -> batches)
def ours(data: Path, workers: int, seed: int, before: bool = False):
    """The runtime's loader over the v1 shards, as the trainer runs it: ``open_split`` (the v1
    files read as the columns features and label), ``TypedLoader`` with ``workers`` loader
    threads, epochs chained by ``chained_epochs``. ``before``: the loader as it was at d0638fe
    (benchmarks/baselines/loader_d0638fe.py)."""
    import torch

    from training_runtime.data.loader import TypedLoader, open_split
    from training_runtime.data.prefetch import chained_epochs
    from training_runtime.data.sampling import epoch_indices

    if before:
        from benchmarks.baselines.loader_d0638fe import TypedLoaderBefore as TypedLoader  # noqa: F811

    split = open_split(_manifest(data), [p for p, _ in _train_files(data)], "train")

    def make_loader(e: int, first: int):
        idx = epoch_indices(split.num_samples, 1, 0, e, seed)
        return TypedLoader(split, idx, BATCH, first, torch.device("cpu"), epoch=e, seed=seed,
                           num_workers=workers, prefetch_batches=4)

    def epoch(e: int):
        if e:
            raise RuntimeError("chained epochs never end")
        for _, loader in chained_epochs(make_loader, 0, -(-split.num_samples // BATCH), 10**9):
            for b in loader:
                yield b["features"], b["label"]
    return epoch


def memmap(data: Path, workers: int, seed: int):
    """The memory-read limit: contiguous batch slices of the memory-mapped shards, copied out
    (batch order shuffled), in one thread."""
    man = _manifest(data)
    dim = math.prod(man["feature_shape"])
    maps = []
    for path, n in _train_files(data):
        maps.append((np.memmap(path, dtype="<f4", mode="r", shape=(n, dim)),
                     np.memmap(path, dtype="<i8", mode="r", offset=n * dim * 4, shape=(n,))))
    slices = [(i, s) for i, (x, _) in enumerate(maps) for s in range(0, len(x), BATCH)]

    def epoch(e: int):
        for k in np.random.default_rng([seed, e]).permutation(len(slices)):
            i, s = slices[k]
            x, y = maps[i]
            yield np.array(x[s:s + BATCH]), np.array(y[s:s + BATCH])
    return epoch


def _dataloader_epochs(dataset, workers: int, seed: int, shuffle: bool):
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    dl = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, num_workers=workers,
                                     persistent_workers=workers > 0, generator=g if shuffle else None)

    def epoch(e: int):
        yield from dl
    return epoch


class PandasDataset:
    """The naive baseline: a DataFrame in memory, one ``iloc`` row per sample."""

    def __init__(self, frame, dim: int):
        self.frame, self.dim = frame, dim

    def __len__(self) -> int:
        return len(self.frame)

    def __getitem__(self, i: int):
        import torch

        row = self.frame.iloc[i]
        return torch.tensor(row.to_numpy()[: self.dim], dtype=torch.float32), int(row["label"])


def pandas(data: Path, workers: int, seed: int):
    import pandas as pd

    x, y = read_train_arrays(data)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    frame["label"] = y
    return _dataloader_epochs(PandasDataset(frame, x.shape[1]), workers, seed, shuffle=True)


def streaming(data: Path, workers: int, seed: int):
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return torch.from_numpy(np.asarray(s["x"], dtype=np.float32)), int(s["y"])

    ds = Decoded(local=str(data / "mds"), remote=None, shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    return _dataloader_epochs(ds, workers, seed, shuffle=False)


def webdataset(data: Path, workers: int, seed: int):
    import torch
    import webdataset as wds

    urls = sorted(str(p) for p in (data / "wds").glob("*.tar"))

    def decode(sample):
        return (torch.from_numpy(np.frombuffer(sample["x.f32"], dtype=np.float32).copy()),
                int(sample["cls"]))

    ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False,
                         nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
          .shuffle(1000).map(decode).batched(BATCH))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                     persistent_workers=workers > 0)

    def epoch(e: int):
        yield from dl
    return epoch


def ours_before(data: Path, workers: int, seed: int):
    """The runtime's loader as it was at commit d0638fe, before its gather ran on several threads
    (benchmarks/baselines/loader_d0638fe.py)."""
    return ours(data, workers, seed, before=True)


LOADERS = {"ours": ours, "ours_before": ours_before, "memmap": memmap,
           "pandas": pandas, "streaming": streaming,
           "webdataset": webdataset}


def measure(loader: str, data: Path, seconds: float, workers: int, seed: int = 0) -> dict:
    warm_page_cache(data / ("shards" if loader in ("ours", "ours_before", "memmap", "pandas") else
                            "mds" if loader == "streaming" else "wds"))
    epoch_fn = LOADERS[loader](data, workers, seed)
    samples, batches, dt, e = time_epochs(loader, epoch_fn, seconds)
    return {"loader": loader, "samples": samples, "batches": batches, "seconds": dt,
            "epochs_started": e, "samples_per_s": samples / dt, "workers": workers}


def time_epochs(loader: str, epoch_fn, seconds: float) -> tuple[int, int, float, int]:
    """(samples, batches, seconds, epochs started) of ``epoch_fn(epoch)``'s (x, y) batches for
    ``seconds`` after two warm-up batches, checking each batch's shape."""
    samples = batches = 0
    warm, t0, e, done = 2, 0.0, 0, False
    while not done:
        for x, y in epoch_fn(e):
            if x.shape[0] == 0 or len(y) != x.shape[0]:
                raise RuntimeError(f"{loader}: malformed batch {tuple(x.shape)} / {len(y)}")
            if warm:
                warm -= 1
                if not warm:
                    t0 = time.perf_counter()
                continue
            samples += x.shape[0]
            batches += 1
            if time.perf_counter() - t0 >= seconds:
                done = True
                break
        e += 1
    return samples, batches, time.perf_counter() - t0, e


# ---------------------------------------------------------------- peer formats
def write_peers(data: Path) -> dict:
    """MDS (MosaicML streaming) and webdataset tar copies of the platform's train split."""
    import shutil

    x, y = read_train_arrays(data)
    dim = x.shape[1]
    out = {}
    mds = data / "mds"
    if not (mds / "index.json").exists():
        from streaming import MDSWriter

        shutil.rmtree(mds, ignore_errors=True)
        with MDSWriter(out=str(mds), columns={"x": f"ndarray:float32:{dim}", "y": "int64"},
                       size_limit=1 << 26) as w:
            for i in range(len(y)):
                w.write({"x": x[i], "y": np.int64(y[i])})
    out["mds_bytes"] = sum(p.stat().st_size for p in mds.rglob("*") if p.is_file())
    wdir = data / "wds"
    if not (wdir / ".complete").exists():
        import webdataset as wds

        shutil.rmtree(wdir, ignore_errors=True)
        wdir.mkdir(parents=True)
        with wds.ShardWriter(str(wdir / "shard-%05d.tar"), maxsize=1 << 26, verbose=0) as w:
            for i in range(len(y)):
                w.write({"__key__": f"{i:08d}", "x.f32": x[i].tobytes(), "cls": str(int(y[i]))})
        (wdir / ".complete").touch()
    out["wds_bytes"] = sum(p.stat().st_size for p in wdir.glob("*.tar"))
    out["samples"] = int(len(y))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loaders")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--loader", choices=sorted(LOADERS), required=True)
    m.add_argument("--data", type=Path, required=True)
    m.add_argument("--seconds", type=float, default=2.0)
    m.add_argument("--workers", type=int, default=2)
    w = sub.add_parser("write-peers")
    w.add_argument("--data", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "measure":
        result = measure(a.loader, a.data, a.seconds, a.workers)
    else:
        result = write_peers(a.data)
    emit(result)


def emit(result: dict) -> None:
    """Print one measurement as JSON for the parent (benchmarks/run.py) and exit at once."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip slow interpreter/worker teardown; results are printed


if __name__ == "__main__":
    sys.exit(main())
