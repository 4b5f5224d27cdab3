"""7c, a table's edit against a whole ingest, as a user runs it: ``DAGSTER_HOME=... python -m
benchmarks.table_growth --source CSV --share 0.01`` builds the platform's definitions for two
dataset pipelines on a CSV source (in the local sources area), then executes their jobs in this
process (the local profile's executor), each a whole ``raw_dataset`` + ``shards`` run with its
checks, its commits and its publication on main:

- ``bench_table``'s first version, on the CSV;
- the same pipeline once the CSV has ``share`` more rows appended (new ids after the others):
  its second version, built on the first one's parts (the run users make when data arrives);
- ``bench_table_full``, a pipeline with no version yet, on the grown CSV: the full ingest.

The second version and the full ingest are timed from the job's start to its end, in an order
``--full-first`` can turn round. One JSON line: their wall times, each data step's time (the
shards asset's steps each, and ``shards`` from its plan's start to its publish's end), and
what the raw asset says it ingested (the appended rows alone, or every row and why) and what the
shards asset says it sharded and read back."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import emit

PIPELINE, FULL = "bench_table", "bench_table_full"
# the raw asset's line on how it ingested (assets/append.py): the new rows alone, or every row and why
APPENDED = "appended to the published version's"
INGEST_LINES = (APPENDED, "every row read (")
# A graph asset's steps (assets/table_ingest_steps.py: plan, an ingest_files step per group of files,
# publish; assets/table_shard_steps.py: plan, a shard_parts step per group, publish),
# timed together under the asset's name, from the first one's start to the last one's end.
GRAPH_STEP = re.compile(r"_(plan|(?:shard_parts|ingest_files)\[[^\]]*\]|publish)$")
DIM = 256


def spec(name: str, source_rel: str, samples_per_shard: int):
    from pipelines.api import dataset_pipeline

    return dataset_pipeline(name, source=source_rel, features=[f"f{i}" for i in range(DIM)], label="label",
                            id_column="sample_id", classes=range(10),
                            split={"seed": 0, "samples_per_shard": samples_per_shard})


def append_rows(base: Path, out: Path, share: float) -> int:
    """``out``: ``base`` with ``share`` of its rows more appended, ids after its last (a CSV grown
    as data arrives: the old bytes unchanged). Returns the rows added."""
    import pandas as pd

    from benchmarks.datagen import _frame

    rows = sum(1 for _ in open(base)) - 1
    added = max(1, round(rows * share))
    extra = _frame(added, DIM, seed=10_000)
    extra["sample_id"] = [f"s{rows + j:09d}" for j in range(added)]
    shutil.copyfile(base, out)
    with open(out, "a") as f:
        extra.to_csv(f, index=False, header=False, float_format="%.6g")
    assert pd.read_csv(out, nrows=1).columns.tolist() == extra.columns.tolist()
    return added


def run_job(defs, instance, name: str) -> dict:
    """One run of ``name``'s job: its wall time, each step's time and the shards asset's log lines."""
    job = defs.resolve_job_def(f"{name}_training")  # pipelines/assembly.py training_job_name
    t0 = time.perf_counter()
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    wall = time.perf_counter() - t0
    if not result.success:
        errs = [e.event_specific_data.error.message.strip() for e in result.all_events if e.is_failure]
        raise SystemExit(f"{name}: the run failed: {errs}")
    starts, steps, said, raw, spans = {}, {}, [], [], {}
    for entry in instance.all_logs(result.run_id):
        ev = entry.dagster_event
        if ev is not None and ev.step_key and ev.event_type_value == "STEP_START":
            starts[ev.step_key] = entry.timestamp
        elif ev is not None and ev.step_key and ev.event_type_value == "STEP_SUCCESS":
            step = ev.step_key.split("__")[-1]
            steps[step] = entry.timestamp - starts[ev.step_key]
            asset = GRAPH_STEP.sub("", step)
            if asset != step:
                first, last = spans.get(asset, (starts[ev.step_key], entry.timestamp))
                spans[asset] = (min(first, starts[ev.step_key]), max(last, entry.timestamp))
        elif "part(s) sharded" in (entry.user_message or "") or "shard checks on" in (entry.user_message or ""):
            said.append(entry.user_message)
        elif any(w in (entry.user_message or "") for w in INGEST_LINES):
            raw.append(entry.user_message)
    made = re.search(r": (\d+) of (\d+) part\(s\) sharded", said[0]) if said else None
    steps.update({asset: last - first for asset, (first, last) in spans.items()})
    return {"wall_s": wall, "step_seconds": steps, "shards_log": said, "raw_log": raw,
            "appended": bool(raw) and APPENDED in raw[0],
            "parts_made": int(made.group(1)) if made else None, "parts": int(made.group(2)) if made else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--share", type=float, default=0.01)
    ap.add_argument("--full-first", action="store_true", help="time the full ingest before the edit")
    ap.add_argument("--samples-per-shard", type=int, default=4096, help="the pipelines' rows a shard (and a part)")
    a = ap.parse_args(argv)
    import dagster as dg

    from pipelines.definitions import build_definitions
    from pipelines.profiles import Profile

    profile = Profile.from_environment()
    area = profile.data_root / "sources" / "bench"
    area.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(a.source, area / "table.csv")
    defs = build_definitions(profile, [spec(PIPELINE, "bench/table.csv", a.samples_per_shard),
                                       spec(FULL, "bench/grown.csv", a.samples_per_shard)], with_yaml=False)
    with dg.DagsterInstance.get() as instance:
        first = run_job(defs, instance, PIPELINE)
        added = append_rows(a.source, area / "grown.csv", a.share)
        shutil.copyfile(area / "grown.csv", area / "table.csv")  # the pipeline's file, grown in place
        order = [FULL, PIPELINE] if a.full_first else [PIPELINE, FULL]
        runs = {name: run_job(defs, instance, name) for name in order}
    grown, full = runs[PIPELINE], runs[FULL]
    emit({"rows": sum(1 for _ in open(a.source)) - 1, "added": added, "source_bytes": a.source.stat().st_size,
          "first": first, "grown": grown, "full": full, "full_first": a.full_first,
          "grown_vs_full": grown["wall_s"] / full["wall_s"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
