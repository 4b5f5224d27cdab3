"""The evaluation op: evaluate a checkpoint on the held-out test split, apply the quality gate,
register a version. ``build_evaluation_op(spec)`` is what the model_version asset runs."""


import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from core import lineage
from core.datasets import plan_dataset_version, tag_published_dataset
from core.pinned_shards import read_pinned_shards
from core.spec import PipelineSpec
from core.versions import register_version
from ops.runs import TRANSIENT_RETRY, commit_metadata, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource
from resources.store.base import VersionedStore


@dataclass
class Outcome:
    value: dict
    metadata: dict


def evaluate_checkpoint(store: VersionedStore, checkpoint: dict, shards: dict) -> tuple[dict, dict, dict, bytes]:
    """(test metrics, validation metrics, resolved config, weights bytes) read at pinned commits."""
    from training_runtime.evaluate import evaluate

    pinned = read_pinned_shards(store, shards["commit_id"], shards["manifest_path"])
    ckpt_dir = checkpoint["weights_path"].rsplit("/", 1)[0] + "/"
    with tempfile.TemporaryDirectory(prefix="evaluate-") as tmp:
        out = Path(tmp)
        for name in ("weights.pt", "resolved_config.json"):
            store.download(checkpoint["commit_id"], ckpt_dir + name, out / name)
        weights = (out / "weights.pt").read_bytes()
        test = evaluate(out, pinned.manifest, pinned.locations, split="test", s3_endpoint_url=pinned.s3_endpoint_url)
        val = evaluate(out, pinned.manifest, pinned.locations, split="validation",
                       s3_endpoint_url=pinned.s3_endpoint_url)
        resolved = json.loads((out / "resolved_config.json").read_text())
    return test, val, resolved, weights


def evaluate_and_register(
    context: dg.OpExecutionContext, spec: PipelineSpec, store: VersionedStore, branch: str,
    checkpoint: dict, shards: dict, raw: dict, run_url: str,
) -> Outcome:
    test, val, resolved, weights = evaluate_checkpoint(store, checkpoint, shards)
    metrics = json.loads(store.get_object(checkpoint["commit_id"], checkpoint["weights_path"].replace("weights.pt", "metrics.json")))
    failures = spec.gate.failures(test)
    gate = {"passed": not failures, "failures": failures, "min_test_accuracy": spec.gate.min_test_accuracy,
            "max_test_loss": spec.gate.max_test_loss}
    evaluation = {"test": test, "validation": val}

    committed: dict[int, dict] = {}  # the record register_version committed, shown again in the UI

    def record_for(version: int) -> dict:
        committed[version] = lineage.build_lineage_record(
            model=spec.name, version=version, checkpoint=checkpoint, shards=shards, raw=raw,
            store_facts=store.describe(), resolved_config=resolved, metrics=metrics, evaluation=evaluation,
            gate=gate, run_id=context.run_id, run_url=run_url, checks=data_checks(raw, shards),
            dataset_version=dataset_version,
            links={k: v for k, v in {"raw": store.ui_link(raw["commit_id"]),
                                     "shards": store.ui_link(shards["commit_id"])}.items() if v})
        return committed[version]

    meta = commit_metadata(context, run_url, quality_gate=gate, test_accuracy=f"{test['accuracy']:.6f}")
    if failures:
        # Keep the evidence on the run branch for inspection; main is untouched.
        store.put_object(branch, f"models/{spec.name}/candidates/{context.run_id}/evaluation.json",
                         json.dumps({"evaluation": evaluation, "gate": gate}, indent=2, sort_keys=True).encode())
        store.commit(branch, f"Candidate {spec.name} failed its quality gate", meta)
        raise dg.Failure(
            description=f"model {spec.name!r} failed its quality gate: {'; '.join(failures)}. "
                        f"Nothing was published; the run branch {branch!r} keeps the evaluation.",
            metadata={"test_accuracy": test["accuracy"], "branch": branch},
            allow_retries=False,
        )
    # The dataset version is named before registering, so the committed lineage record states it
    # (record_for reads it), and tagged only after register_version's merge has published the
    # shards: a dataset tag means "on main". A published record is the claim its tag must honour:
    # planning creates any tag such a record names but the store lacks, and a concurrent tagger of
    # the same number is resolved in tag_published_dataset by re-reading the tags.
    dataset_version = plan_dataset_version(store, shards["dataset"], shards["commit_id"])
    reg = register_version(store, branch, spec.name, record_for, weights, meta)
    tag_published_dataset(store, shards["dataset"], shards["commit_id"], planned=dataset_version)
    value = {"model": spec.name, "version": reg.version, "tag": reg.tag, "commit_id": reg.commit_id,
             "main_commit_id": reg.main_commit_id, "dataset_version": dataset_version}
    metadata = {
        "version": reg.version, "tag": reg.tag, "commit_id": reg.commit_id, "dataset_version": dataset_version,
        "test_accuracy": test["accuracy"], "test_loss": test["loss"], "validation_accuracy": val["accuracy"],
        "quality_gate": "passed",
        "lineage": dg.MetadataValue.md(
            lineage.lineage_markdown(committed[reg.version] | {"version_commit": reg.commit_id})),
    }
    return Outcome(value=value, metadata=metadata)


def build_evaluation_op(spec: PipelineSpec) -> dg.OpDefinition:
    """The evaluation op of one pipeline: checkpoint, shards and raw data in, model version out."""

    @dg.op(name=f"{spec.name}_evaluation", retry_policy=TRANSIENT_RETRY, out=dg.Out(dict),
           ins={"checkpoint": dg.In(dict), "shards": dg.In(dict), "raw": dg.In(dict)},
           description="Evaluate on the pinned test split, apply the quality gate, register and publish.")
    def evaluation(context: dg.OpExecutionContext, checkpoint: dict, shards: dict, raw: dict,
                   platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        outcome = evaluate_and_register(context, spec, s, branch, checkpoint, shards, raw,
                                        platform.run_url(context.run_id))
        return dg.Output(outcome.value, data_version=dg.DataVersion(outcome.value["commit_id"]),
                         metadata=outcome.metadata)

    return evaluation


def data_checks(raw: dict, shards: dict) -> dict:
    """The Great Expectations results behind the data this version was trained on."""
    checks = dict(shards.get("checks") or {})
    if raw.get("checks"):
        checks["raw_dataset"] = raw["checks"]
    checks["dataset"] = shards["dataset"]
    return checks

