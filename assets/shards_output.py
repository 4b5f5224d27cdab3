"""What the shards asset of an image folder, a text corpus or a table ends with, however its shards
were made (in one step, or over steps: assets/image_shard_steps.py, assets/table_shard_steps.py):
the manifest's provenance, one commit with the validation report, the asset's output and
metadata, its blocking check, and for a dataset pipeline the publication to main."""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import dagster as dg

from core.datasets import DATA_KEY
from core.spec import PipelineSpec


def stamp_manifest(spec: PipelineSpec, manifest: dict, raw: dict) -> None:
    """What the manifest says of where its data came from: the raw commit, the code location, and
    the data key a later run compares to reuse these shards."""
    manifest["source_commit"] = raw["commit_id"]
    manifest["location"] = spec.location
    if raw.get("data_key"):
        manifest[DATA_KEY] = raw["data_key"]


def shards_outputs(context, store, spec: PipelineSpec, key: dg.AssetKey, raw: dict, manifest: dict, report,
                   branch: str, platform, checked):
    """Commit the staged shards with ``report``, then yield the output and the check (which stops
    the run when the report failed). ``checked`` is assets.pipeline's helpers."""
    commit_checked, gate, _replace_prefix, publish, _check_owner, link = checked
    name = spec.name
    shard_prefix = f"datasets/{name}/shards/"
    commit_id = commit_checked(context, store, branch, platform, report, "shards", f"Shard {name}",
                               raw_commit=raw["commit_id"])
    counts = {k: v["num_samples"] for k, v in manifest["splits"].items()}
    value = {"dataset": name, "commit_id": commit_id, "prefix": shard_prefix,
             "manifest_path": shard_prefix + "manifest.json", "raw_commit": raw["commit_id"], "num_samples": counts,
             "location": spec.location, "checks": {"raw_dataset": raw.get("checks"), "shards": report.summary()}}
    if report.passed and not spec.trains:  # a pipeline that trains publishes with its model version
        value["dataset_version"] = publish(context, store, branch, platform, name, commit_id)
    yield dg.Output(value, output_name="result", data_version=dg.DataVersion(commit_id), metadata={
        "commit_id": commit_id, **{f"{k}_samples": n for k, n in counts.items()},
        **({"columns": dg.MetadataValue.json(manifest["columns"]),  # typed shards; a v1 table's have none
            "preprocessing": dg.MetadataValue.json(manifest.get("preprocessing", {}))} if "columns" in manifest else {}),
        "store_link": link(store, commit_id),
        **({"dataset_version": value["dataset_version"]} if "dataset_version" in value else {})})
    yield from gate(context, report, key, "shard_expectations", commit_id, branch)
