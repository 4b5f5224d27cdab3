"""Another code location's dataset, read as it was published on ``main``.

A pipeline whose ``dataset_location`` names another team's location does not run that team's
raw_dataset and shards assets: it reads their output at a published version (a dataset tag
``<dataset>-d<N>``, see core/datasets.py). This module turns such a commit into the same
``shards`` and ``raw`` values the owner's assets hand to training and evaluation, so the rest of
the pipeline cannot tell the difference, and the lineage points at the owner's commits and location.
"""

from __future__ import annotations

import json

from core.datasets import manifest_path, validation_report_path
from resources.store.base import RefNotFoundError, VersionedStore

SUMMARY_KEYS = ("asset", "passed", "evaluated", "failed", "engine")  # as QualityReport.summary() has them


class DatasetNotPublishedError(LookupError):
    """The dataset has no shards at the commit a version names."""


def validation_summary(store: VersionedStore, commit_id: str, dataset: str, asset: str) -> dict | None:
    """The summary of the validation report committed beside the data (None if there is none)."""
    path = validation_report_path(dataset, asset)
    if not store.exists(commit_id, path):
        return None
    report = json.loads(store.get_object(commit_id, path))
    return {**{k: report.get(k) for k in SUMMARY_KEYS}, "failures": report.get("failures", [])[:20]}


def published_inputs(store: VersionedStore, dataset: str, commit_id: str, version: str | None) -> tuple[dict, dict]:
    """(shards, raw) values of ``dataset`` at ``commit_id``, as the owner's assets produced them."""
    path = manifest_path(dataset)
    try:
        manifest = json.loads(store.get_object(commit_id, path))
    except RefNotFoundError as exc:
        raise DatasetNotPublishedError(
            f"dataset {dataset!r} has no shards at commit {commit_id[:12]} ({path} is missing); its owner's "
            "pipeline must publish it first") from exc
    raw_commit = manifest.get("source_commit") or commit_id  # the raw commit the shards were built from
    location = manifest.get("location")
    raw_checks = validation_summary(store, raw_commit, dataset, "raw_dataset")
    raw = {"dataset": dataset, "commit_id": raw_commit, "path": f"datasets/{dataset}/raw/data.parquet",
           "location": location, "checks": raw_checks}
    shards = {"dataset": dataset, "commit_id": commit_id, "prefix": path.rsplit("/", 1)[0] + "/",
              "manifest_path": path, "raw_commit": raw_commit, "location": location, "dataset_version": version,
              "num_samples": {k: v["num_samples"] for k, v in manifest["splits"].items()},
              "checks": {"raw_dataset": raw_checks, "shards": validation_summary(store, commit_id, dataset, "shards")}}
    return shards, raw
