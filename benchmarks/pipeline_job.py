"""The whole local pipeline once, as a user runs it: ``DAGSTER_HOME=... python -m
benchmarks.pipeline_job --source CSV --dim D --epochs E`` builds the platform's definitions for a
benchmark pipeline, executes its training job in process (the local profile's executor) and prints
one JSON line: wall times and when the first training step began (the runtime's "starting at step"
message, forwarded through Dagster Pipes into the run's event log), and what the data assets'
materializations say (a second run on unchanged data reuses the first one's dataset version)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

T_PROCESS = time.time()  # as early as this module runs

from benchmarks.common import emit  # noqa: E402

PIPELINE = "bench_overhead"
DATA_ASSETS = ("raw_dataset", "shards")


def spec(source_rel: str, dim: int, epochs: int, batch: int):
    from core.spec import model_pipeline

    return model_pipeline(
        PIPELINE, source=source_rel, features=[f"f{i}" for i in range(dim)], label="label",
        id_column="sample_id", classes=range(10), model="mlp", model_kwargs={"hidden_sizes": [1024, 1024]},
        recipe={"epochs": epochs, "batch_size": batch, "lr": 1e-3, "optimizer": "adamw", "world_size": 2,
                "seed": 0},
        gate={"min_test_accuracy": 0.0}, split={"seed": 0, "samples_per_shard": 4096})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--launched-at", type=float, required=True, help="time.time() when the parent spawned us")
    a = ap.parse_args(argv)
    import dagster as dg

    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.profiles import Profile

    profile = Profile.from_environment()
    dest = profile.data_root / "sources" / "bench" / a.source.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(a.source, dest)  # the user's file in the sources area (not timed below)
    s = spec(f"bench/{a.source.name}", a.dim, a.epochs, a.batch)
    t_defs = time.time()
    defs = build_definitions(profile, [s])
    job = defs.resolve_job_def(training_job_name(s))
    with dg.DagsterInstance.get() as instance:
        t_exec = time.time()
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        t_done = time.time()
        if not result.success:
            errs = [e.event_specific_data.error.message.strip() for e in result.all_events if e.is_failure]
            raise SystemExit(f"pipeline run failed: {errs}")
        first_step = None
        step_times: dict[str, float] = {}
        training: dict[str, float] = {}
        data: dict[str, dict] = {}
        for entry in instance.all_logs(result.run_id):  # one pass over the run's event log
            msg = entry.user_message or ""
            if first_step is None and "starting at step" in msg:
                first_step = entry.timestamp
            ev = entry.dagster_event
            if ev is None or not ev.step_key:
                continue
            if ev.event_type_value in ("STEP_START", "STEP_SUCCESS"):
                step_times[f"{ev.step_key}:{ev.event_type_value}"] = entry.timestamp
            elif ev.event_type_value == "ASSET_MATERIALIZATION":
                materialization = ev.event_specific_data.materialization
                asset, meta = materialization.asset_key.path[-1], materialization.metadata
                if asset == "checkpoint":
                    for key in ("samples_per_second", "steps", "checkpoint_stall_s_total", "data_wait_share"):
                        if key in meta:
                            training[key] = float(getattr(meta[key], "value", meta[key]))
                elif asset in DATA_ASSETS:  # a run on unchanged data names the version it reused (assets/reuse.py)
                    data[asset] = {key: getattr(meta[key], "value", meta[key])
                                   for key in ("reused_dataset_version", "commit_id", "dataset_version") if key in meta}
        steps = {key.split(":")[0]: step_times[key.replace("START", "SUCCESS")] - t
                 for key, t in step_times.items()
                 if key.endswith("STEP_START") and key.replace("START", "SUCCESS") in step_times}
    emit({"launched_at": a.launched_at, "process_started_at": T_PROCESS, "definitions_at": t_defs,
          "execute_at": t_exec, "done_at": t_done, "first_step_at": first_step, "step_seconds": steps,
          "training_figures": training, "data_assets": data,
          "run_id": result.run_id})
    return 0


if __name__ == "__main__":
    sys.exit(main())
