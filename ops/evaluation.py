"""The evaluation op: evaluate a checkpoint on the held-out test split, apply the quality gate,
register a version. ``build_evaluation_op(spec)`` is what the model_version asset runs."""


import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from core import lineage
from core.datasets import plan_dataset_version, tag_published_dataset
from core.overrides import apply_overrides
from core.pinned_shards import read_pinned_shards
from core.spec import PipelineSpec
from core.versions import register_version
from ops.runs import TRANSIENT_RETRY, commit_metadata, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource
from resources.store.base import VersionedStore

ONNX_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class Outcome:
    value: dict
    metadata: dict


# Files of a checkpoint that evaluation reads, and those a registered version keeps.
CHECKPOINT_FILES = ("model.safetensors", "model_card.json", "resolved_config.json")
VERSION_FILES = ("model.safetensors", "model_card.json")
ONNX_CHECK_SAMPLES = 256  # test samples the ONNX export is compared with PyTorch on
CONTINUATIONS = 3  # sampled continuations a language model's version records


@dataclass
class Evaluated:
    """What evaluating a checkpoint gives registration."""

    test: dict
    validation: dict
    resolved_config: dict
    files: dict[str, bytes]  # the version folder's files: weights, card, tokenizer, ONNX
    onnx: dict  # the export row: ok, max_abs_diff, tolerance, ... or the error that stopped it
    evaluated_on: str  # where test and validation were computed: the training job's device, or here and why
    class_names: list[str] = field(default_factory=list)
    continuations: list[dict] = field(default_factory=list)


def evaluate_checkpoint(store: VersionedStore, checkpoint: dict, shards: dict) -> Evaluated:
    """Test and validation metrics of the checkpoint's model, read at pinned commits (those the
    training job computed on its device when its evaluation.json is of these weights), its ONNX
    export checked against PyTorch on test samples, and (language models) a few continuations.
    The export, its check and the continuations always run here, on CPU: they read a few hundred
    test samples, and serving runs the ONNX file on CPU too."""
    from training_runtime.data.shards import sha256_file
    from training_runtime.serve.evaluate import evaluate
    from training_runtime.serve.card import load_model

    pinned = read_pinned_shards(store, shards["commit_id"], shards["manifest_path"])
    ckpt_dir = checkpoint["weights_path"].rsplit("/", 1)[0] + "/"
    with tempfile.TemporaryDirectory(prefix="evaluate-") as tmp:
        out = Path(tmp)
        for name in CHECKPOINT_FILES:
            store.download(checkpoint["commit_id"], ckpt_dir + name, out / name)
        tokenizer = (pinned.manifest.get("tokenizer") or {})
        if tokenizer.get("kind") == "bpe":  # shipped beside the shards; serving needs it to read prompts
            shard_dir = shards["manifest_path"].rsplit("/", 1)[0] + "/"
            store.download(shards["commit_id"], shard_dir + TOKENIZER_FILE, out / TOKENIZER_FILE)
        loaded = load_model(out)
        from_pod, evaluated_on = training_job_metrics(store, checkpoint, sha256_file(out / "model.safetensors"))
        if from_pod is not None:
            test, val = from_pod["test"], from_pod["validation"]
        else:
            common = {"s3_endpoint_url": pinned.s3_endpoint_url, "loaded": loaded}
            test = evaluate(out, pinned.manifest, pinned.locations, split="test", **common)
            val = evaluate(out, pinned.manifest, pinned.locations, split="validation", **common)
        samples = test_inputs(pinned, loaded)
        onnx = export_row(loaded, samples, out / ONNX_FILE)
        continuations = []
        if loaded.info.task == "language_modeling":
            from training_runtime.serve.text_samples import sample_continuations

            continuations = sample_continuations(loaded, samples["tokens"][:CONTINUATIONS])
        files = {name: (out / name).read_bytes() for name in (*VERSION_FILES, TOKENIZER_FILE, ONNX_FILE)
                 if (out / name).is_file() and (name != ONNX_FILE or onnx.get("passed"))}
        resolved = json.loads((out / "resolved_config.json").read_text())
    return Evaluated(test=test, validation=val, resolved_config=resolved, files=files, onnx=onnx,
                     evaluated_on=evaluated_on, class_names=list(loaded.card.get("class_names") or []),
                     continuations=continuations)


def training_job_metrics(store: VersionedStore, checkpoint: dict, weights_sha256: str) -> tuple[dict | None, str]:
    """The test and validation metrics the training job committed beside the weights (recipe
    evaluate_on "training") when they are of the weights whose sha256 is given, else None; and why."""
    from training_runtime.serve.evaluate_after_training import EVALUATION_FILE, evaluation_for_weights

    path = checkpoint["weights_path"].rsplit("/", 1)[0] + "/" + EVALUATION_FILE
    record = None
    if store.exists(checkpoint["commit_id"], path):
        try:
            record = json.loads(store.get_object(checkpoint["commit_id"], path))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} at commit {checkpoint['commit_id'][:12]} is not JSON ({exc}); re-run the "
                             "training, or train with recipe evaluate_on 'step'") from exc
    return evaluation_for_weights(record, weights_sha256)


def test_inputs(pinned, loaded) -> dict:
    """The first ONNX_CHECK_SAMPLES test samples: the model's inputs, and the raw token windows."""
    import numpy as np

    from training_runtime.data.batches import split_loader
    from training_runtime.data.shards import resolve_shards
    from training_runtime.data.info import model_batch
    from training_runtime.data.split import open_split

    cache = str(Path(tempfile.gettempdir()) / "training_runtime_shard_cache")
    paths = resolve_shards(pinned.manifest, pinned.locations, "test", cache, pinned.s3_endpoint_url, verify=False)
    data = open_split(pinned.manifest, paths, "test")
    n = min(ONNX_CHECK_SAMPLES, data.num_samples)
    loader = split_loader(data, loaded.info, np.arange(n), 64, 0, torch_cpu(), epoch=0, seed=0)
    inputs, tokens = [], []
    for raw in loader:
        x = model_batch(loaded.info, raw)["input"]
        if loaded.info.task == "language_modeling":
            tokens.append(x.numpy())
            x = x[:, :-1]  # the model reads seq_len tokens; the last one is only a target
        inputs.append(x)
    return {"inputs": inputs, "tokens": np.concatenate(tokens) if tokens else None}


def torch_cpu():
    import torch

    return torch.device("cpu")


def export_row(loaded, samples: dict, path: Path) -> dict:
    """The ONNX export of the model, checked by onnxruntime against PyTorch on test samples; a
    failed export is a row that says why, not a failed registration (the weights serve anyway)."""
    from training_runtime.serve.export import export_and_check

    return export_and_check(loaded.model, samples["inputs"], path)


def evaluate_and_register(
    context: dg.OpExecutionContext, spec: PipelineSpec, store: VersionedStore, branch: str,
    checkpoint: dict, shards: dict, raw: dict, run_url: str,
) -> Outcome:
    ev = evaluate_checkpoint(store, checkpoint, shards)
    context.log.info(f"Test and validation metrics: {ev.evaluated_on}")
    ckpt_dir = checkpoint["weights_path"].rsplit("/", 1)[0] + "/"
    metrics = json.loads(store.get_object(checkpoint["commit_id"], ckpt_dir + "metrics.json"))
    evaluation = {"test": ev.test, "validation": ev.validation}
    failures = spec.gate.failures(evaluation)
    gate = spec.gate.record(failures)
    serving = {"files": sorted(ev.files), "onnx": ev.onnx, "continuations": ev.continuations}

    committed: dict[int, dict] = {}  # the record register_version committed, shown again in the UI

    def record_for(version: int) -> dict:
        committed[version] = lineage.build_lineage_record(
            model=spec.name, version=version, checkpoint=checkpoint, shards=shards, raw=raw,
            store_facts=store.describe(), resolved_config=ev.resolved_config, metrics=metrics, evaluation=evaluation,
            gate=gate, run_id=context.run_id, run_url=run_url, checks=data_checks(raw, shards),
            dataset_version=dataset_version, serving=serving,
            links={k: v for k, v in {"raw": store.ui_link(raw["commit_id"]),
                                     "shards": store.ui_link(shards["commit_id"])}.items() if v})
        return committed[version]

    headline = headline_metrics(evaluation)
    meta = commit_metadata(context, run_url, quality_gate=gate, **{k: f"{v:.6f}" for k, v in headline.items()})
    if failures:
        # Keep the evidence on the run branch for inspection; main is untouched.
        store.put_object(branch, f"models/{spec.name}/candidates/{context.run_id}/evaluation.json",
                         json.dumps({"evaluation": evaluation, "gate": gate}, indent=2, sort_keys=True).encode())
        store.commit(branch, f"Candidate {spec.name} failed its quality gate", meta)
        raise dg.Failure(
            description=f"model {spec.name!r} failed its quality gate: {'; '.join(failures)}. "
                        f"Nothing was published; the run branch {branch!r} keeps the evaluation.",
            metadata={**headline, "branch": branch},
            allow_retries=False,
        )
    # The dataset version is named before registering, so the committed lineage record states it
    # (record_for reads it), and tagged only after register_version's merge has published the
    # shards: a dataset tag means "on main". A published record is the claim its tag must honour:
    # planning creates any tag such a record names but the store lacks, and a concurrent tagger of
    # the same number is resolved in tag_published_dataset by re-reading the tags.
    dataset_version = plan_dataset_version(store, shards["dataset"], shards["commit_id"])
    reg = register_version(store, branch, spec.name, record_for, ev.files, meta)
    tag_published_dataset(store, shards["dataset"], shards["commit_id"], planned=dataset_version)
    value = {"model": spec.name, "version": reg.version, "tag": reg.tag, "commit_id": reg.commit_id,
             "main_commit_id": reg.main_commit_id, "dataset_version": dataset_version}
    metadata = {
        "version": reg.version, "tag": reg.tag, "commit_id": reg.commit_id, "dataset_version": dataset_version,
        **headline, "quality_gate": "passed", "task": committed[reg.version]["task"], "evaluated_on": ev.evaluated_on,
        "onnx": lineage.onnx_summary(ev.onnx),
        "lineage": dg.MetadataValue.md(
            lineage.lineage_markdown(committed[reg.version] | {"version_commit": reg.commit_id})),
    }
    if ev.continuations:
        metadata["sampled_continuations"] = dg.MetadataValue.md(continuations_markdown(ev.continuations))
    if "confusion_matrix" in ev.test:
        from ops import plots  # deferred: matplotlib is not needed to load definitions

        png = plots.confusion_matrix_png(ev.test["confusion_matrix"], ev.class_names, f"{spec.name}: test split")
        metadata["confusion_matrix"] = dg.MetadataValue.md(plots.markdown_image(png, "confusion matrix"))
    return Outcome(value=value, metadata=metadata)


def headline_metrics(evaluation: dict) -> dict[str, float]:
    """Every scalar metric of every split as ``<split>_<metric>``: what Dagster plots across runs."""
    return {f"{split}_{k}": float(v) for split, m in evaluation.items() for k, v in lineage.scalar_metrics(m).items()}


def continuations_markdown(samples: list[dict]) -> str:
    rows = "\n".join(f"| {_cell(s['prompt'])} | {_cell(s['continuation'])} |" for s in samples)
    return f"| prompt (held-out text) | the model's continuation |\n| --- | --- |\n{rows}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def build_evaluation_op(spec: PipelineSpec) -> dg.OpDefinition:
    """The evaluation op of one pipeline: checkpoint, shards and raw data in, model version out."""

    @dg.op(name=f"{spec.name}_evaluation", retry_policy=TRANSIENT_RETRY, out=dg.Out(dict),
           ins={"checkpoint": dg.In(dict), "shards": dg.In(dict), "raw": dg.In(dict)},
           description="Evaluate on the pinned test split, apply the quality gate, register and publish.")
    def evaluation(context: dg.OpExecutionContext, checkpoint: dict, shards: dict, raw: dict,
                   platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        # The run's overrides (its gate among them) arrive with the checkpoint; checked when it trained.
        run_spec = apply_overrides(spec, checkpoint.get("overrides"))
        outcome = evaluate_and_register(context, run_spec, s, branch, checkpoint, shards, raw,
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

