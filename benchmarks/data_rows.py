"""The data-preparation rows of the benchmark table (figures 3, 7 and 7b): CSV → shards by the
assets' data path against pyarrow + numpy, how its time and memory grow with the source, and
whether a large source completes under a memory limit. The measurements run in
benchmarks/probes.py. ``RUNNERS`` measure; ``render`` turns results.json's entries into rows."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.common import ProbeError, fit_exponent, median, rotate
from benchmarks.harness import Ctx, Rows, fmt, measured


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


# ---------------------------------------------------------------- 7. growth
def _limited(ctx: Ctx, src: Path, how: str) -> dict:
    """One path over ``src`` under the data limit. A library may abort the whole process when an
    allocation fails (Arrow's CSV parser does: ``Check failed``, SIGABRT) instead of raising, and
    the probe cannot report that itself: the death is this path's result, the other paths go on."""
    try:
        return ctx.probe("preprocess", {"source": str(src), "dim": 256, "samples_per_shard": 4096, "how": how,
                                        "chunk_mb": ctx.p["chunk_mb"], "tmp": str(ctx.data),
                                        "data_limit_mb": ctx.p["limit_mb"]}, env=LIMITED_ENV)
    except ProbeError as e:
        text = str(e)
        code = re.search(r"exited (-?\d+)", text)
        causes = [re.sub(r"^.* exited -?\d+: ", "", ln).strip() for ln in text.splitlines()
                  if re.search(r"Check failed|Error|error", ln)]
        return {"how": how, "ok": False, "process_died": True,
                "error": f"the process died (exit {code.group(1) if code else '?'}): "
                         f"{(causes[-1] if causes else text)[-240:]}"}


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
    limited = {how: _limited(ctx, big, how) for how in PREPROCESS_PATHS}

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


def render(b: dict, rows: Rows) -> None:
    """Rows 3, 7 and 7b of ``b`` (results.json's ``benchmarks``)."""
    if measured(b.get("preprocess")):
        s = b["preprocess"]
        m = s["median_mb_per_s"]
        rows.add(f"3. preprocessing, CSV → shards ({s['source_bytes'] / 2**20:.0f} MB CSV)",
                 f"platform {fmt(s['platform_vs_pyarrow'])}× pyarrow+numpy",
                 f"platform (the assets' data path: chunks, Parquet copy, shards) {fmt(m['platform'])} MB/s; "
                 f"pyarrow+numpy {fmt(m['pyarrow'])} MB/s; with the assets' GE raw suite {fmt(m.get('platform_ge'))} MB/s "
                 f"({fmt(s.get('platform_ge_vs_pyarrow'))}×); whole-frame functions {fmt(m.get('whole'))} MB/s "
                 f"({fmt(s.get('whole_vs_pyarrow'))}×); same shards: {s['same_shards']}",
                 "≥ 0.6×", s["platform_vs_pyarrow"] >= 0.6)
    if measured(b.get("growth")):
        s = b["growth"]
        for name, g in ((f"preprocessing (platform, {s.get('chunk_mb')} MB chunks)", s["preprocess"]["platform"]),
                        ("preprocessing (platform with GE raw suite)", s["preprocess"].get("platform_ge")),
                        ("preprocessing (whole-frame functions)", s["preprocess"].get("whole")),
                        ("loading (runtime loader)", s["load"])):
            if g is None:
                continue
            rows.add(f"7. growth, {name}, 1×/4×/16×", f"time ∝ size^{g['exponent']:.2f}; working memory "
                     f"{g['anon_growth_16x_vs_1x']:.1f}× from 1× to 16×",
                     "s: " + "/".join(f"{g['seconds'][str(f)]:.2f}" for f in s["factors"]) + "; peak anonymous MB "
                     "above the process' start: " + "/".join(f"{g['work_anon_mb'][str(f)]:.0f}" for f in s["factors"]),
                     "exponent ≤ ~1.1; memory flat (≤ 1.5×)", g["exponent"] <= 1.1 and g["anon_growth_16x_vs_1x"] <= 1.5,
                     how="each size once, in order")
        lim = s["memory_limit"]
        env = " ".join(f"{k}={v}" for k, v in LIMITED_ENV.items())
        for how in PREPROCESS_PATHS:
            r = lim.get(how)
            if r is None:
                continue
            rows.add(f"7b. {lim['source_bytes'] / 2**20:.0f} MB CSV under a {lim['limit_mb_above_imports']} MB "
                     f"data limit ({how})", "completed" if r["ok"] else f"failed: {r.get('error', '')[:160]}",
                     (f"{r['seconds']:.1f} s; peak anonymous {r['work_anon_bytes'] / 2**20:.0f} MB above start; "
                      if "seconds" in r else "") + env,
                     "completes", r["ok"], how="once")


RUNNERS = {"preprocess": bench_preprocess, "growth": bench_growth}
