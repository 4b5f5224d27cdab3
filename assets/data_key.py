"""The data key: what a dataset version's bytes are made from, known before anything is made.

A run whose raw content and preprocessing equal those of the dataset's newest published version
reuses that version's commit instead of ingesting and sharding again (core/datasets.py
``reusable_version``), so one dataset version is one commit. The key is the sha256 of three
parts, each kept in the shards manifest (``data_key``) so that a run that does not reuse can say
which part changed:

- ``sources``: every source file's name, size and content hash (sha256, or the store's checksum
  of a file in its ``sources/`` area); a loader's frame by the hash of its cells, columns and dtypes.
- ``parameters``: every pipeline field that decides what ingest and sharding write or check: the
  task, columns, classes, id column, target range, feature shape, the source's parsing options,
  preprocessing, split, chunking, location, and the expectation suites (by their code).
- ``code``: the platform's ingest, sharding, preprocessing and check code (the files listed in
  ``DATA_CODE``), a user preprocessing function's source, and the versions of the libraries that
  write the bytes (``LIBRARIES``).

Anything the key leaves out cannot change the data; anything that might is in it, so a
changed library or a reformatted module makes a new version, never a wrong reuse.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from core.datasets import DATA_KEY_PARTS
from core.spec import PipelineSpec

REPO = Path(__file__).resolve().parents[1]
# What makes the bytes of raw_dataset and shards, and their checks: a change here is new data.
DATA_CODE = ("assets/ingest.py", "assets/source.py", "assets/arrow_csv.py", "assets/append.py",
             "assets/parquet_splice.py", "assets/sharding.py", "assets/prefetch.py", "assets/kinds",
             "assets/quality", "core/expectations.py", "training_runtime/data/shard_format.py")
LIBRARIES = ("numpy", "pandas", "pyarrow", "pillow", "simplejpeg", "tokenizers", "great-expectations")


def sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def data_key(spec: PipelineSpec, sources: list[dict]) -> dict[str, str]:
    """``{"sha256", "sources", "parameters", "code"}``: the key and the sha256 of each of its parts."""
    made = {"sources": lambda: sorted(sources, key=lambda s: json.dumps(s, sort_keys=True)),
            "parameters": lambda: parameters(spec), "code": lambda: code(spec)}
    parts = {name: sha256_json(made[name]()) for name in DATA_KEY_PARTS}  # the parts core.datasets compares
    return {"sha256": sha256_json(parts), **parts}


def frame_sha256(frame: pd.DataFrame) -> str:
    """A loader's frame by its content: each row's cells (index included), the columns and dtypes."""
    h = hashlib.sha256(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()


SPREAD_ONLY = ("parts_per_step", "files_per_step")  # source fields that say how the work is spread over steps, not what it makes


def parameters(spec: PipelineSpec) -> dict:
    table = spec.source is not None and hasattr(spec.source, "chunk_mb")
    source = plain(spec.source)
    if isinstance(source, dict):
        source = {k: v for k, v in source.items() if k not in SPREAD_ONLY}
    return {"task": spec.task, "feature_columns": list(spec.feature_columns), "label_column": spec.label_column,
            "label_columns": list(spec.label_columns), "class_names": list(spec.class_names),
            "id_column": spec.id_column, "target_range": list(spec.target_range) if spec.target_range else None,
            "shape": list(spec.shape) if spec.feature_columns or spec.feature_shape else None,
            "source": source, "preprocessing": plain(spec.preprocessing), "split": plain(spec.split),
            "chunk_rows": spec.chunk_rows if table else None, "location": spec.location,
            "expectations": {"raw": identity(spec.expectations.raw), "shards": identity(spec.expectations.shards)}}


def code(spec: PipelineSpec) -> dict:
    function = getattr(spec.preprocessing, "function", None)
    return {"platform": platform_code_sha256(), "libraries": library_versions(),
            "preprocessing_function": identity(_import(function)) if function else None}


@functools.lru_cache(maxsize=1)
def platform_code_sha256() -> str:
    """sha256 over the files of ``DATA_CODE`` (their paths and bytes), read once per process."""
    h = hashlib.sha256()
    for entry in DATA_CODE:
        path = REPO / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def library_versions() -> dict[str, str | None]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None  # not installed: then it wrote nothing
    return found


def plain(value: Any) -> Any:
    """A spec value as JSON: dataclasses as their fields, callables by ``identity``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if callable(value):
        return identity(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def identity(fn: Any) -> Any:
    """A callable by what it does: its qualified name and the sha256 of its source (a partial by
    its function and arguments). Code whose source cannot be read is named by its repr, which
    changes from run to run: such data is never reused, rather than reused wrongly."""
    if fn is None:
        return None
    if isinstance(fn, _Unimportable):
        return {"unimportable": fn.why}
    if isinstance(fn, functools.partial):
        return {"partial": identity(fn.func), "args": plain(fn.args), "kwargs": plain(fn.keywords)}
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return {"name": name, "repr": repr(fn)}
    return {"name": name, "source_sha256": hashlib.sha256(source.encode()).hexdigest()}


def _import(path: str) -> Any:
    """The user's ``"package.module:function"``; one that cannot be imported is named by its path
    and the error, for ingest to stop on with the kind's own message."""
    module, _, attr = path.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # the user's module: any error it raises on import
        return _Unimportable(f"{path}: {type(exc).__name__}: {exc}")
    return target


@dataclasses.dataclass(frozen=True)
class _Unimportable:
    why: str

    def __repr__(self) -> str:
        return f"unimportable {self.why}"
