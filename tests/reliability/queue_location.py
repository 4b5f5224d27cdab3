"""A code location for the queue load test: one op that holds GPU units of the instance's pool
while it 'trains' (sleeps), recording when it held them."""

import json
import time
from pathlib import Path

import dagster as dg

from resources.gpu_pool import gpu_units


class GpuWorkConfig(dg.Config):
    units: int = 1
    seconds: float = 1.0
    record_dir: str


@dg.op
def gpu_work(context: dg.OpExecutionContext, config: GpuWorkConfig) -> None:
    with gpu_units(context.instance, context.run_id, "gpu_work", config.units, poll_interval_s=0.5):
        start = time.time()
        time.sleep(config.seconds)
        end = time.time()
    Path(config.record_dir, f"{context.run_id}.json").write_text(json.dumps(
        {"run_id": context.run_id, "units": config.units, "start": start, "end": end}))


@dg.job(executor_def=dg.in_process_executor)
def gpu_queue_job():
    gpu_work()


defs = dg.Definitions(jobs=[gpu_queue_job])
