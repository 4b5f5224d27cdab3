"""``demo``: run the digits job once and print the lineage of every version it registered (the MLP,
the YAML-declared CNN and the denoising autoencoder with its own training loop); then the jobs of
the diabetes table (regression), the shapes image folder (a ResNet) and the pydoc corpus (a
language model), printing each version's lineage and each dataset's published versions; and last the
wine job, whose training is a sweep (6 Optuna trials, 2 at a time, laggards pruned): the best
trial is registered, and the sweep's trials are printed as ``python -m pipelines sweeps wine`` does."""

from __future__ import annotations

import argparse
import sys

from pipelines.cli.experiments import sweeps_command
from pipelines.cli.inspection import print_lineage
from pipelines.cli.instance import dagster_instance
from pipelines.cli.render import format_dataset_versions
from pipelines.cli.sources import write_example_sources
from pipelines.profiles import Profile

# The jobs the demo runs, in order; its help says so (tests/cli check the two agree).
DEMO_JOBS = ("digits_training", "diabetes_training", "shapes_training", "pydoc_training", "wine_training")
DEMO_HELP = ("Write the example sources under DAGSTER_HOME/platform/sources, then run 5 jobs in this process and "
             "print the lineage of each version they register: digits_training (the digits MLP, the CNN declared "
             "in YAML and the denoising autoencoder with its own training loop), diabetes_training (regression), "
             "shapes_training (a ResNet on an image folder), pydoc_training (a language model), each also listing "
             "its dataset's published versions, and wine_training (a sweep of 6 Optuna trials, 2 at a time, "
             "laggards pruned), then the sweep's trials. What `make demo` runs; minutes on two cores.")


def demo_jobs() -> tuple[str, ...]:
    """The jobs ``demo_command`` runs, from the pipelines it runs them for."""
    from pipelines.definitions import training_job_name
    from pipelines.models.diabetes import diabetes_dataset
    from pipelines.models.digits import digits_pipeline
    from pipelines.models.pydoc_corpus import pydoc_corpus
    from pipelines.models.shapes import shapes_dataset
    from pipelines.models.wine import wine_pipeline

    return tuple(training_job_name(s) for s in (digits_pipeline, diabetes_dataset, shapes_dataset, pydoc_corpus,
                                                wine_pipeline))


def demo_command(args: argparse.Namespace) -> int:
    from core.datasets import list_dataset_versions
    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.models import PIPELINES
    from pipelines.models.diabetes import diabetes_dataset
    from pipelines.models.digits import digits_pipeline
    from pipelines.models.pydoc_corpus import pydoc_corpus
    from pipelines.models.shapes import shapes_dataset
    from pipelines.models.wine import wine_pipeline

    profile = Profile.from_environment()
    write_example_sources(profile.data_root / "sources")
    defs = build_definitions(profile, PIPELINES)
    with dagster_instance() as instance:
        result = _run(defs, training_job_name(digits_pipeline), instance)
        if result is None:
            return 1
        print(f"Run {result.run_id} succeeded.\n")
        # The digits job also trains the models that share its shards (e.g. the YAML-declared CNN).
        models = sorted({e.asset_key.path[0] for e in result.get_asset_materialization_events()
                         if e.asset_key.path[-1] == "model_version"}, key=lambda m: (m != digits_pipeline.name, m))
        for model in models:
            print_lineage(profile, model, None, as_json=False)
            print()
        for dataset in (diabetes_dataset, shapes_dataset, pydoc_corpus):
            result = _run(defs, training_job_name(dataset), instance)
            if result is None:
                return 1
            for model in sorted({e.asset_key.path[0] for e in result.get_asset_materialization_events()
                                 if e.asset_key.path[-1] == "model_version"}):
                print_lineage(profile, model, None, as_json=False)
                print()
            print(format_dataset_versions(dataset.name, list_dataset_versions(profile.store(), dataset.name)))
            print()
        result = _run(defs, training_job_name(wine_pipeline), instance)
        if result is None:
            return 1
        print_lineage(profile, wine_pipeline.name, None, as_json=False)
        print()
    return sweeps_command(argparse.Namespace(model=wine_pipeline.name, study=None, compare=None, json=False))


def _run(defs, job_name: str, instance):
    """Run a job in process; on failure print each failed step and return None."""
    result = defs.resolve_job_def(job_name).execute_in_process(instance=instance, raise_on_error=False)
    if result.success:
        return result
    for event in result.all_events:
        if event.is_failure:
            print(f"FAILED {event.step_key}: {event.event_specific_data.error.message.strip()}", file=sys.stderr)
    return None
