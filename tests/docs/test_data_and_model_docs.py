"""What the pages say about settings a user writes, checked against the code: every
``ImagePreprocessing`` field (``channels`` among them) is in docs/images-and-text.md with its real
default, and a model factory is called as docs/own-training-code.md says, for tables, grey images
and text."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from core.spec import ImagePreprocessing
from tests.serving.test_card_alone import TABLE, image_manifest, text_manifest
from training_runtime.data.info import DataInfo
from training_runtime.models.build import model_build
from training_runtime.tasks.registry import resolve_task

DOCS = Path(__file__).resolve().parents[2] / "docs"


def table_rows(page: str) -> dict[str, list[str]]:
    """``{name: [cells after it]}`` of the page's table rows whose first cell is a `name`."""
    rows = {}
    for line in (DOCS / page).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and re.fullmatch(r"`[\w*]+`(, `[\w*]+`)*", cells[0]):
            rows[cells[0].replace("`", "")] = cells[1:]
    return rows


def written(value: object) -> str:
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def test_every_image_preprocessing_field_is_documented_with_its_default():
    rows = table_rows("images-and-text.md")
    for f in dataclasses.fields(ImagePreprocessing):
        assert f.name in rows, f"docs/images-and-text.md does not document ImagePreprocessing({f.name}=)"
        assert rows[f.name][0] == written(f.default), (f.name, rows[f.name][0], f.default)
    assert '`"RGB"`' in rows["channels"][1] and '`"L"`' in rows["channels"][1] and "`[1, H, W]`" in rows["channels"][1]


RECORDED: list[dict] = []


def recording_factory(input_shape, num_classes, vocab_size=None, **kwargs):
    """A factory that notes how the platform called it."""
    import torch

    RECORDED.append({"input_shape": input_shape, "num_classes": num_classes, "vocab_size": vocab_size, **kwargs})
    return torch.nn.Linear(1, 1)


def pad_only_factory(input_shape, num_classes, pad_id):
    """A factory whose signature names pad_id and takes no **kwargs."""
    import torch

    RECORDED.append({"input_shape": input_shape, "num_classes": num_classes, "pad_id": pad_id})
    return torch.nn.Linear(1, 1)


def called_with(manifest: dict, kwargs: dict, factory: str = "recording_factory") -> dict:
    info = DataInfo.from_manifest(manifest)
    RECORDED.clear()
    model_build(f"{__name__}:{factory}", kwargs, info, resolve_task(info.task, info).num_outputs()).build()
    (call,) = RECORDED
    return call


def test_a_model_factory_is_called_as_the_docs_say():
    page = (DOCS / "own-training-code.md").read_text()
    assert "factory(input_shape=[...], num_classes=N, **model_kwargs)" in page
    assert {"input_shape", "num_classes", "**model_kwargs", "vocab_size, pad_id"} <= set(table_rows("own-training-code.md"))
    assert sys.modules[__name__].recording_factory is recording_factory  # found by its import path
    # A table: [features]; a regression of one target: one output; model_kwargs as they are.
    assert called_with(TABLE, {"width": 8}) == {"input_shape": [3], "num_classes": 1, "vocab_size": None, "width": 8}
    # Grey images: [1, H, W] and the classes.
    assert called_with(image_manifest("L"), {}) == {"input_shape": [1, 24, 32], "num_classes": 3, "vocab_size": None}
    assert called_with(image_manifest("RGB"), {})["input_shape"] == [3, 24, 32]
    # A language model: seq_len of its seq_len + 1 windows, the vocabulary as outputs, vocab_size
    # because the signature names it and pad_id because it takes **kwargs.
    byte = {"kind": "byte", "vocab_size": 258, "eos_id": 256, "pad_id": 257}
    lm = called_with(text_manifest("language_modeling", 13, byte), {})
    assert lm == {"input_shape": [12], "num_classes": 258, "vocab_size": 258, "pad_id": 257}
    # A signature that names only pad_id gets only pad_id (vocab_size would not bind).
    assert called_with(text_manifest("classification", 16, byte), {}, "pad_only_factory") == {
        "input_shape": [16], "num_classes": 2, "pad_id": 257}
    # A value set in model_kwargs wins over the data's.
    assert called_with(text_manifest("language_modeling", 13, byte), {"vocab_size": 300})["vocab_size"] == 300


def excerpt_blocks(page: str, source: str) -> list[str]:
    text = (DOCS / page).read_text()
    return re.findall(rf"<!-- example: excerpt {re.escape(source)} -->\n```python\n(.*?)```", text, flags=re.S)


def undefined_names(block: str) -> set[str]:
    """Names the block reads that it neither imports nor assigns (``...`` lines are Ellipsis)."""
    import ast
    import builtins

    tree = ast.parse(block)
    bound = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for a in node.names}
    bound |= {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound - set(dir(builtins))


def test_the_image_and_text_excerpts_show_every_name_they_use():
    """A user copying the shapes excerpt gets its imports, ROOT and CLASSES with it."""
    for source in ("pipelines/models/shapes.py", "pipelines/models/pydoc_corpus.py"):
        (block,) = excerpt_blocks("images-and-text.md", source)
        assert not undefined_names(block), (source, undefined_names(block))
