"""Definition errors of YAML blocks, located in the file that declares the block.

``core.spec`` reports a bad declaration as ``pipeline 'foo', field 'recipe.epochs': must be at
least 1``. Someone who wrote ``pipelines/defs/foo/defs.yaml`` needs the file and the line instead:
``pipelines/defs/foo/defs.yaml:7: field 'recipe.epochs': must be at least 1 (pipeline 'foo')``.
Dagster's YAML loader keeps the position of every key (``SourcePositionTree``); a block keeps the
tree of its document, and errors about it are re-raised at the line of the field's key.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol, Sequence

import dagster as dg
from dagster_shared.yaml_utils.source_position import SourcePositionTree

from core.spec import PipelineDefinitionError

# The message core.spec._fail writes; a name that is not a valid pipeline name may come quoted
# either way by repr().
_SPEC_MESSAGE = re.compile(r"pipeline (['\"])(?P<pipeline>.*?)\1, field '(?P<field>[^']*)': (?P<problem>.*)", re.S)


class BlockDefinitionError(PipelineDefinitionError):
    """A PipelineDefinitionError about a block declared in YAML, at the line of the field's key."""

    def __init__(self, file: str, line: int, field: str | None, problem: str, pipeline: str):
        self.file, self.line, self.field, self.problem, self.pipeline = file, line, field, problem, pipeline
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{file}:{line}: {what}{problem} (pipeline {pipeline!r})")


@dataclass(frozen=True)
class YamlSource:
    """The YAML document that declares one block: its file and the position of each key."""

    file: str  # as errors show it: relative to the project root when the file is under it
    tree: SourcePositionTree  # the document's tree; the block's fields are under "attributes"

    @classmethod
    def of(cls, context: dg.ComponentLoadContext) -> "YamlSource | None":
        """The document being loaded, or None for a block not loaded from a file (built in Python)."""
        tree = context.resolution_context.source_position_tree
        if tree is None or tree.position.filename == "<string>":
            return None
        path = Path(tree.position.filename)
        root = Path(context.project_root)
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        return cls(file=str(shown), tree=tree)

    def line_of(self, key: str | None) -> int:
        """Line of ``attributes.<key>`` (dotted for nested keys); a key not written in the file (a
        default) falls back to the nearest enclosing key that is, at worst ``attributes:`` itself."""
        path = ["attributes", *(key.split(".") if key else [])]
        position, _ = self.tree.lookup_closest_and_path(path, None)
        return position.start.line


class LocatableBlock(Protocol):
    """What locating an error needs of a block (pipelines.components.blocks.Block)."""

    name: str

    @property
    def yaml_source(self) -> YamlSource | None: ...

    def yaml_key(self, spec_field: str) -> str:
        """The YAML key a PipelineSpec field is written as in this block (``model`` -> ``model_name``)."""
        ...


@contextmanager
def errors_located(blocks: Sequence[LocatableBlock]) -> Iterator[None]:
    """Re-raise a PipelineDefinitionError about one of ``blocks`` at the line of its field.

    The error names its pipeline; the block of that name locates it. An error naming no block of
    ``blocks`` (or one built in Python, without a file) goes on unchanged. With a single block,
    an error that does not name a field is about that block: it is located at ``attributes:``.
    """
    try:
        yield
    except BlockDefinitionError:
        raise
    except PipelineDefinitionError as exc:
        located = _locate(exc, blocks)
        if located is None:
            raise
        raise located from exc


def _locate(exc: PipelineDefinitionError, blocks: Sequence[LocatableBlock]) -> BlockDefinitionError | None:
    match = _SPEC_MESSAGE.fullmatch(str(exc))
    if match is None:
        if len(blocks) != 1 or blocks[0].yaml_source is None:
            return None
        block = blocks[0]
        return BlockDefinitionError(block.yaml_source.file, block.yaml_source.line_of(None), None, str(exc),
                                    block.name)
    block = next((b for b in blocks if b.name == match["pipeline"] and b.yaml_source is not None), None)
    if block is None:
        return None
    key = block.yaml_key(match["field"])
    return BlockDefinitionError(block.yaml_source.file, block.yaml_source.line_of(key), key, match["problem"],
                                match["pipeline"])
