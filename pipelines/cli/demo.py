"""``demo``: run the digits job once and print the lineage of every version it registered."""

from __future__ import annotations

import argparse
import sys

from pipelines.cli.inspection import print_lineage
from pipelines.profiles import Profile


def demo_command(args: argparse.Namespace) -> int:
    import dagster as dg

    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.models import PIPELINES
    from pipelines.models.digits import digits_pipeline, write_digits_source

    profile = Profile.from_environment()
    write_digits_source(profile.data_root / "sources")
    defs = build_definitions(profile, PIPELINES)
    job = defs.resolve_job_def(training_job_name(digits_pipeline))
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    if not result.success:
        for event in result.all_events:
            if event.is_failure:
                print(f"FAILED {event.step_key}: {event.event_specific_data.error.message.strip()}", file=sys.stderr)
        return 1
    print(f"Run {result.run_id} succeeded.\n")
    # The digits job also trains the models that share its shards (e.g. the YAML-declared CNN).
    models = sorted({e.asset_key.path[0] for e in result.get_asset_materialization_events()
                     if e.asset_key.path[-1] == "model_version"}, key=lambda m: (m != digits_pipeline.name, m))
    for i, model in enumerate(models):
        if i:
            print()
        print_lineage(profile, model, None, as_json=False)
    return 0
