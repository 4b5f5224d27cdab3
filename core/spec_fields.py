"""What every check of a pipeline's fields shares: the error, its message, and the scalar types of
a settings dataclass's fields. Below core.spec, so the modules that check parts of a spec (sweeps,
overrides) need not import the spec itself."""

from __future__ import annotations

import dataclasses
from typing import NoReturn


class PipelineDefinitionError(ValueError):
    """A pipeline definition that cannot work, found when definitions load."""


def fail(pipeline: str, field_name: str, problem: str) -> NoReturn:
    raise PipelineDefinitionError(f"pipeline {pipeline!r}, field {field_name!r}: {problem}")


def scalar_field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Field -> (its scalar type, whether None is allowed), read from the annotations of a dataclass
    whose fields are int, float, str or bool, optionally ``| None`` (a Recipe)."""
    out = {}
    for f in dataclasses.fields(cls):
        parts = str(f.type).replace(" ", "").split("|")
        base = next(t for t in parts if t != "None")
        out[f.name] = ({"int": int, "float": float, "str": str, "bool": bool}[base], "None" in parts)
    return out
