"""One-off overrides of a pipeline: its recipe, its model's keyword arguments and its quality gate,
changed for one run without editing the pipeline.

They arrive as run config of the training op (the Launchpad shows ``overrides_config_schema``), or
from the CLI as ``--set train.lr=0.005`` (``parse_set``). ``apply_overrides`` returns the spec the
run uses; it is validated by ``PipelineSpec`` itself, so an override fails with the same message
as the pipeline's own field would. ``override_record`` is what the lineage keeps: what the pipeline
said and what the run used, per overridden field.

Sections: ``train`` (every ``Recipe`` field), ``model`` (the model factory's keyword arguments),
``gate`` (``<split>_<metric>: {min, max}`` bounds) and ``guards`` (every guard setting, e.g.
``--set guards.hang_timeout_s=120``; described by the runtime's ``GuardsConfig``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from dataclasses import replace
from typing import Any, Mapping, Sequence

from core.spec import Guards, PipelineDefinitionError, PipelineSpec, Recipe, gate_from
from core.spec_fields import scalar_field_types

SECTIONS = ("train", "model", "gate", "guards")
# Run tag on a run that changes its pipeline's settings: the queue and the UI tell them apart.
OVERRIDES_TAG = "platform/overrides"


class OverrideError(ValueError):
    """An override that names no field, has the wrong type, or breaks the pipeline's rules."""


def recipe_field_types() -> dict[str, tuple[type, bool]]:
    """Recipe field -> (its scalar type, whether None is allowed), from the annotations."""
    return scalar_field_types(Recipe)


# The recipe's first fields are the classic ones, uncommented in core/spec.py.
_CLASSIC_DOCS = {
    "epochs": "passes over the training split", "batch_size": "samples per optimizer step across all ranks",
    "lr": "peak learning rate", "optimizer": "'adamw' or 'sgd' (momentum 0.9)", "weight_decay": "decoupled weight decay",
    "lr_schedule": "'cosine', 'constant' or 'linear_warmup_cosine'", "warmup_steps": "linear warm-up steps",
    "grad_accum_steps": "micro-batches accumulated per optimizer step", "seed": "seed of weights, shuffling and dropout",
    "nnodes": "nodes (pods) the training spans", "sharding": "'ddp', 'fsdp' or 'hsdp'",
    "precision": "'fp32' or 'bf16'", "checkpoint_every_steps": "optimizer steps between checkpoints",
    "keep_last_checkpoints": "checkpoints kept on disk", "async_checkpoint": "write checkpoints in the background",
    "max_restarts": "times torchrun restarts failed workers (each resumes from the last checkpoint)",
    "gpus_per_node": "GPUs per node (0: CPU with gloo)", "gpu_resource_name": "Kubernetes GPU resource (or MIG profile)",
}


def guard_field_types() -> dict[str, tuple[type, bool]]:
    return scalar_field_types(Guards)


def guard_field_docs() -> dict[str, str]:
    """Guard setting -> its description, the runtime's own (training_runtime/config.py)."""
    return {f.name: f.metadata["description"] for f in dataclasses.fields(Guards)}


def recipe_field_docs() -> dict[str, str]:
    """Recipe field -> the comment beside it in core/spec.py: one text for the code and the UI."""
    docs = dict(_CLASSIC_DOCS)
    for line in inspect.getsource(Recipe).splitlines():
        m = re.match(r"\s+(\w+):[^#=]+=[^#]*#\s*(.+)$", line)
        if m:
            docs[m.group(1)] = m.group(2).strip()
    return docs


def parse_set(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["train.lr=0.005", "gate.test_accuracy.min=0.9", "model.hidden=[64, 32]"]`` -> nested
    overrides. Values are read as JSON (numbers, true/false, null, lists), else kept as text."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        path = key.strip().split(".")
        if not sep or len(path) < 2 or not all(path):
            raise OverrideError(f"--set {item!r}: write <section>.<field>=<value>, e.g. train.lr=0.005 "
                                f"(sections: {', '.join(SECTIONS)})")
        if path[0] not in SECTIONS:
            raise OverrideError(f"--set {item!r}: {path[0]!r} is not a section; use one of {', '.join(SECTIONS)}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        node = out.setdefault(path[0], {})
        for part in path[1:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise OverrideError(f"--set {item!r}: {key!r} is set twice with different shapes")
        node[path[-1]] = value
    return out


def _coerce(field_name: str, value: Any, kind: type, nullable: bool, section: str = "train") -> Any:
    if value is None:
        if nullable:
            return None
        raise OverrideError(f"override {section}.{field_name}: cannot be null; give a {kind.__name__}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
        return value
    raise OverrideError(f"override {section}.{field_name}: {value!r} is not a {kind.__name__}"
                        + (" (or null)" if nullable else ""))


def _typed_section(overrides: Mapping[str, Any], section: str, types: dict[str, tuple[type, bool]],
                   what: str) -> dict[str, Any]:
    values = dict(overrides.get(section) or {})
    for name in values:
        if name not in types:
            raise OverrideError(f"override {section}.{name}: {what} has no field {name!r}; its fields are "
                                f"{sorted(types)}")
        values[name] = _coerce(name, values[name], *types[name], section=section)
    return values


def apply_overrides(spec: PipelineSpec, overrides: Mapping[str, Any] | None) -> PipelineSpec:
    """The spec a run with ``overrides`` uses, validated as the pipeline's own fields are."""
    overrides = dict(overrides or {})
    if not overrides:
        return spec
    unknown = sorted(set(overrides) - set(SECTIONS))
    if unknown:
        raise OverrideError(f"override section {unknown[0]!r} does not exist; use {', '.join(SECTIONS)}")
    train = _typed_section(overrides, "train", recipe_field_types(), "the recipe")
    guards = _typed_section(overrides, "guards", guard_field_types(), "guards")
    model = dict(overrides.get("model") or {})
    if model and spec.model is None:
        raise OverrideError(f"override model.{next(iter(model))}: pipeline {spec.name!r} trains no model")
    gate = overrides.get("gate") or {}
    if not isinstance(gate, Mapping):
        raise OverrideError(f"override gate: {gate!r} must map <split>_<metric> to {{'min': x}} and/or {{'max': y}}")
    try:
        bounds = spec.gate.all_bounds()
        for key, bound in gate.items():
            if not isinstance(bound, Mapping):
                raise OverrideError(f"override gate.{key}: {bound!r} must be {{'min': x}} and/or {{'max': y}}")
            bounds[key] = {**bounds.get(key, {}), **bound}
        # An explicit null drops a bound ("gate.test_accuracy.min=null").
        bounds = {k: {m: v for m, v in b.items() if v is not None} for k, b in bounds.items()}
        new_gate = gate_from(spec.name, {k: b for k, b in bounds.items() if b}) if gate else spec.gate
        return replace(spec, recipe=replace(spec.recipe, **train), model_kwargs={**spec.model_kwargs, **model},
                       gate=new_gate, guards=replace(spec.guards, **guards))
    except PipelineDefinitionError as exc:
        raise OverrideError(f"override rejected: {exc}") from exc


def override_record(spec: PipelineSpec, overrides: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{"train.lr": {"pipeline": 0.01, "run": 0.005}, ...}``: each overridden field, flat."""
    record: dict[str, dict[str, Any]] = {}
    for name, value in ((overrides or {}).get("train") or {}).items():
        record[f"train.{name}"] = {"pipeline": getattr(spec.recipe, name), "run": value}
    for name, value in ((overrides or {}).get("model") or {}).items():
        record[f"model.{name}"] = {"pipeline": spec.model_kwargs.get(name), "run": value}
    for name, value in ((overrides or {}).get("guards") or {}).items():
        record[f"guards.{name}"] = {"pipeline": getattr(spec.guards, name), "run": value}
    bounds = spec.gate.all_bounds()
    for key, bound in ((overrides or {}).get("gate") or {}).items():
        for side, value in bound.items():
            record[f"gate.{key}.{side}"] = {"pipeline": bounds.get(key, {}).get(side), "run": value}
    return {k: v for k, v in sorted(record.items()) if v["pipeline"] != v["run"]}


def overrides_tag(record: Mapping[str, Mapping[str, Any]]) -> str:
    """The tag value: ``train.lr=0.005 train.seed=1`` (Dagster tag values hold at most 4096 chars)."""
    return " ".join(f"{k}={json.dumps(v['run'])}" for k, v in record.items())[:4000]


def overrides_config_schema(spec: PipelineSpec) -> dict[str, Any]:
    """The training op's config schema: every field optional, described, with the pipeline's value."""
    import dagster as dg

    docs = recipe_field_docs()
    train = {}
    for name, (kind, nullable) in recipe_field_types().items():
        current = getattr(spec.recipe, name)
        what = docs.get(name, name.replace("_", " ")).rstrip(".") + "."
        what = what[0].upper() + what[1:]
        train[name] = dg.Field(dg.Noneable(kind) if nullable else kind, is_required=False,
                               description=f"{what} The pipeline says {json.dumps(current)}.")
    model = {k: dg.Field(dg.Any, is_required=False, description=f"Model keyword argument {k!r}; the pipeline says "
                         f"{json.dumps(v, default=str)}.") for k, v in spec.model_kwargs.items()}
    bound = dg.Shape({side: dg.Field(dg.Noneable(float), is_required=False,
                                     description=f"{side}imum allowed (null drops the bound).")
                      for side in ("min", "max")})
    gate = {k: dg.Field(bound, is_required=False, description=f"Bound on {k}; the pipeline says {json.dumps(v)}.")
            for k, v in spec.gate.all_bounds().items()}
    guard_docs = guard_field_docs()
    guards = {name: dg.Field(dg.Noneable(kind) if nullable else kind, is_required=False,
                             description=f"{guard_docs[name]} The pipeline says {json.dumps(getattr(spec.guards, name))}.")
              for name, (kind, nullable) in guard_field_types().items()}
    return {
        "train": dg.Field(dg.Shape(train), is_required=False,
                          description="Recipe fields to change for this run (e.g. lr, epochs, seed)."),
        "model": dg.Field(dg.Permissive(model), is_required=False,
                          description="Keyword arguments of the model factory to change for this run."),
        "gate": dg.Field(dg.Permissive(gate), is_required=False,
                         description="Quality-gate bounds to change for this run, as <split>_<metric>: {min, max}."),
        "guards": dg.Field(dg.Shape(guards), is_required=False,
                           description="Guard settings to change for this run (e.g. hang_timeout_s, "
                                       "nonfinite_skip_batches); checked as the pipeline's own are."),
    }
