"""Row 10e's probe, one process per measurement: the runtime's loader (``TypedLoader``, the
trainer's defaults: one loader thread, 4 batches ahead) over a train split in the runtime's own
sample order, read from local files or streamed from S3 through the rank's ``ShardCache``. From
S3, one epoch first fills the cache (its limit holds the split, so nothing is evicted: the warm
cache a second epoch reads); then both time their batches for ``seconds``.

``python -m benchmarks.stream_probe '{"root": ..., "where": "s3"|"local", ...}'`` prints one JSON line.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import emit


def _order(shard_sizes: list[int], epoch: int, batch: int):
    from training_runtime.data.sampling import rank_epoch_indices

    # one rank, one partition, the runtime's default shuffle block of 4 shards
    return rank_epoch_indices(shard_sizes, 0, epoch, 1, 1, 0, batch, 4)


def measure(a: dict) -> dict:
    import torch

    from benchmarks.datagen import locations
    from training_runtime.data.cache import ShardCache, shard_refs
    from training_runtime.data.loader import TypedLoader
    from training_runtime.data.shards import resolve_shards
    from training_runtime.data.split import open_split, open_streaming_split

    root, batch = Path(a["root"]), a["batch"]
    manifest = json.loads((root / "shards" / "manifest.json").read_text())
    sizes = [s["num_samples"] for s in manifest["splits"]["train"]["shards"]]
    cache = None
    if a["where"] == "s3":
        shutil.rmtree(a["cache_dir"], ignore_errors=True)
        total = sum(s["num_bytes"] for s in manifest["splits"]["train"]["shards"])
        cache = ShardCache(a["cache_dir"], 2 * total, 2, a["endpoint"])
        split = open_streaming_split(manifest, shard_refs(manifest, a["remote"], "train"), "train", cache)
    else:
        split = open_split(manifest, resolve_shards(manifest, locations(root, manifest), "train", None), "train")

    def epoch(e: int):
        loader = TypedLoader(split, _order(sizes, e, batch), batch, 0, torch.device("cpu"), epoch=e, seed=0,
                             columns=["features", "label"])
        try:
            yield from loader
        finally:
            loader.close()

    e, fill_s = 0, 0.0
    if cache is not None:  # the epoch that fills the cache
        t0 = time.perf_counter()
        for _ in epoch(e):
            pass
        fill_s, e = time.perf_counter() - t0, 1
    fetched_before = cache.stats.bytes_fetched if cache is not None else 0
    samples, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a["seconds"]:
        for b in epoch(e):
            samples += len(b["label"])
            if time.perf_counter() - t0 >= a["seconds"]:
                break
        e += 1
    dt = time.perf_counter() - t0
    out = {"where": a["where"], "samples": samples, "seconds": dt, "samples_per_s": samples / dt, "fill_s": fill_s,
           "bytes_fetched_while_timed": (cache.stats.bytes_fetched - fetched_before) if cache is not None else 0}
    if cache is not None:
        cache.close()
    return out


def main(argv: list[str] | None = None) -> int:
    emit(measure(json.loads((argv or sys.argv[1:])[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
