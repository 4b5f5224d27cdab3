"""Ops that read another code location's published dataset for a pipeline that trains on it.

The checkpoint asset of such a pipeline resolves the dataset version first (the run's
``platform/dataset_version`` tag, set by the new-data sensor, else the pipeline's pinned
version, else the newest); the model_version asset reads the same commit back from the
checkpoint, so training and evaluation always see one version.
"""

from collections.abc import Mapping

import dagster as dg

from core.datasets import resolve_dataset_version
from core.published_datasets import DatasetNotPublishedError, published_inputs
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY
from resources.platform import VersionedStoreResource

DATASET_VERSION_TAG = "platform/dataset_version"  # the published version a run trains on


def build_published_dataset_op(spec: PipelineSpec) -> dg.OpDefinition:
    """Resolve the version to train on; out: the ``shards`` value the training op takes."""

    @dg.op(name=f"{spec.name}_published_dataset", ins={"published": dg.In(dg.Nothing)}, out=dg.Out(dict),
           retry_policy=TRANSIENT_RETRY,
           description=f"Pin {spec.dataset!r}, published by code location {spec.dataset_location!r}, to one "
                       "version on main.")
    def published_dataset(context: dg.OpExecutionContext, store: VersionedStoreResource) -> dict:
        shards = dataset_to_train_on(store.get(), spec, context.run.tags)
        context.log.info(f"{spec.name} trains on {shards['dataset_version']} (commit {shards['commit_id'][:12]}) "
                         f"published by {shards['location']}")
        context.add_output_metadata({"dataset": spec.dataset, "dataset_version": shards["dataset_version"],
                                     "commit_id": shards["commit_id"], "owner_location": shards["location"] or ""})
        return shards

    return published_dataset


def dataset_to_train_on(store, spec: PipelineSpec, run_tags: Mapping[str, str]) -> dict:
    """The ``shards`` value of the version a run trains on: the one its tag names (a new-data run),
    else the one the pipeline pins, else the newest published."""
    wanted = run_tags.get(DATASET_VERSION_TAG) or spec.dataset_version
    try:
        tag, commit_id = resolve_dataset_version(store, spec.dataset, wanted)
        shards, _ = published_inputs(store, spec.dataset, commit_id, tag)
    except (LookupError, DatasetNotPublishedError) as exc:
        raise dg.Failure(description=f"pipeline {spec.name!r}: {exc}", allow_retries=False) from exc
    _check_owner(spec, shards)
    return shards


def build_trained_dataset_op(spec: PipelineSpec) -> dg.OpDefinition:
    """The dataset version a checkpoint was trained on, read back for evaluation and lineage."""

    @dg.op(name=f"{spec.name}_trained_dataset", ins={"checkpoint": dg.In(dict)}, retry_policy=TRANSIENT_RETRY,
           out={"shards": dg.Out(dict), "raw": dg.Out(dict)},
           description=f"Read back the {spec.dataset!r} version the checkpoint was trained on.")
    def trained_dataset(context: dg.OpExecutionContext, checkpoint: dict, store: VersionedStoreResource):
        shards, raw = published_inputs(store.get(), spec.dataset, checkpoint["shards_commit"],
                                       checkpoint.get("dataset_version"))
        return shards, raw

    return trained_dataset


def _check_owner(spec: PipelineSpec, shards: dict) -> None:
    """The published shards must come from the location the pipeline names (two teams, one name)."""
    owner = shards.get("location")
    if owner is not None and owner != spec.dataset_location:
        raise dg.Failure(
            description=f"pipeline {spec.name!r} (location {spec.location!r}) expects dataset {spec.dataset!r} from "
                        f"code location {spec.dataset_location!r}, but the published version was written by "
                        f"{owner!r}; fix dataset_location, or rename one of the two datasets",
            allow_retries=False)
