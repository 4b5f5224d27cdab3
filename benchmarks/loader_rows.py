"""The loader rows of the benchmark table (figures 1, 2, 8a and 8b): the runtime's loader against
the memory-read limit and the peers, the data stall it leaves a training step, and the typed
loader on JPEGs (against the decoder alone) and on token windows. The loaders' own code is
benchmarks/loaders.py and typed_loaders.py. ``RUNNERS`` measure; ``render`` turns results.json's
entries into rows."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from benchmarks.common import PEERS_PY, ProbeError, median, rotate, run_json
from benchmarks.harness import IMAGE_PEERS, PEERS, Ctx, Rows, fmt, measured

# ---------------------------------------------------------------- 1. loader throughput
def bench_gather(ctx: Ctx) -> dict:
    """The runtime's loader, and the v1 loader as it was at d0638fe (benchmarks/baselines), against the
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


def _typed_rows(b: dict, rows: Rows) -> None:
    """Rows of figure 8, the typed-column (v2) loaders."""
    def side(e: dict, ratios: dict) -> str:
        med = e.get("median_samples_per_s", {})
        return "; ".join([f"{k} {fmt(v, '{:,.0f}')}/s ({fmt(ratios.get(k))}×)" for k, v in med.items()]
                         + [f"{k}: not measured ({v[:160]})" for k, v in e.get("errors", {}).items()])

    e = b.get("image_loader")
    if measured(e):
        r = e.get("vs_decoder_alone", {})
        ours = r.get("ours")
        rows.add(f"8a. image loader, {e['samples']} JPEGs 128×128 (~{e['mean_jpeg_bytes'] / 1000:.0f} KB), batch 256, "
                 f"{e['threads']} decode threads",
                 f"ours {fmt(ours)}× the decoder alone; with random crop 112 + flip {fmt(r.get('ours_augmented'))}×",
                 side(e, r), "≥ 0.9× decoder alone", None if ours is None else ours >= 0.9)
    e = b.get("token_loader")
    if measured(e):
        r = e.get("vs_memory_read_limit", {})
        ours = r.get("ours")
        rows.add(f"8b. token loader, {e['samples']} int32 windows of 129 ({e['shard_bytes'] / 2**20:.0f} MB), batch 256",
                 f"ours {fmt(ours)}× memory-read limit", side(e, r), "≥ 0.5× limit",
                 None if ours is None else ours >= 0.5)


def render(b: dict, rows: Rows) -> None:
    """The loader rows of ``b`` (results.json's ``benchmarks``), in the table's order."""
    for key in ("loaders", "gather"):
        if not measured(b.get(key)):
            continue
        for label in sorted(b[key]["sizes"], key=lambda k: int(k.removesuffix("KB"))):
            e = b[key]["sizes"][label]
            vs = e.get("vs_memory_read_limit", {})
            med = e.get("median_samples_per_s", {})
            side = "; ".join([f"{k} {fmt(med.get(k), '{:,.0f}')}/s ({fmt(vs.get(k))}×)"
                              for k in ["memmap", "ours", "ours_before", *PEERS]
                              if k in med] + [f"{k}: not measured ({v[:120]})" for k, v in e["errors"].items()])
            ours = vs.get("ours")
            rows.add(f"1{'' if key == 'loaders' else 'b'}. loader throughput{'' if key == 'loaders' else ' (gather re-run)'}, "
                     f"{label} samples ({e['train_bytes'] / 2**20:.0f} MB)",
                     f"ours {fmt(ours)}× memory-read limit" + (f"; {fmt(e['ours_vs_best_peer'], '{:.1f}')}× best peer "
                                                        f"({e['best_peer']})" if "ours_vs_best_peer" in e else ""),
                     side, "≥ 0.8× limit" + ("; ≥ 10× best peer" if label == "4KB" and key == "loaders" else ""),
                     None if ours is None else ours >= 0.8 and (label != "4KB" or e.get("ours_vs_best_peer", 99) >= 10))
    _typed_rows(b, rows)
    if measured(b.get("stall")):
        s = b["stall"]
        rows.add("2. data stall (4 KB, batch 256)", f"{s['stall_share'] * 100:.2f} % of step time",
                 f"compute step {s['compute_step_s'] * 1000:.1f} ms; {s['loader']}; with the loader of "
                 f"d0638fe {s['stall_share_before'] * 100:.2f} %; share of the wait spent on each epoch's first batch "
                 f"{fmt(s.get('first_batch_share_of_wait'))}; with num_workers=2 "
                 f"{fmt(s.get('stall_share_two_workers', float('nan')) * 100)} %", "≤ 1 %", s["stall_share"] <= 0.01)


RUNNERS = {"loaders": bench_loaders, "stall": bench_stall, "image_loader": bench_image_loader,
           "token_loader": bench_token_loader}
EXTRA = {"gather": bench_gather}  # only with --only: its figures are a subset of "loaders"'
