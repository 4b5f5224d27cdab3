"""Shard format v2: typed columns, in the spirit of MosaicML's MDS and FFCV's fields.

A shard file holds one block per column, in the manifest's column order, each starting at a
multiple of ``ALIGN`` bytes (so memory-mapped views are aligned for any dtype):

- ``ndarray``: fixed-shape samples of one dtype (uint8 images, int32 tokens, float32 features,
  scalar or vector labels): ``num_samples * prod(shape)`` little-endian values, C order. Readers
  memory-map the block and gather a batch without decoding sample by sample.
- ``bytes``: variable-length samples (encoded JPEG/PNG, raw text): ``num_samples + 1`` uint64
  offsets, then the concatenated payloads. ``str`` is the same, UTF-8 (ids).

The shard's manifest entry records each block's offset, so a reader needs no header. The
manifest (``"format": FORMAT_V2``) names the columns with their kind, dtype, shape and role
(``input``, ``target``, ``id``).

Shard format v1 (classification tables: all float32 features of the shard's samples, then their
int64 labels, nothing else in the file) is two ndarray blocks without padding, so a v1 manifest
is read as the v2 manifest ``as_v2`` makes of it: columns ``features`` (input) and ``label``
(target) at offsets worked out from ``feature_shape``, over the same files. One reader, one
loader for both. Only numpy here: the writer (assets) and the reader (the training runtime, in
the pods) share it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT_V1 = "model-factory.shards/v1"
FORMAT_V2 = "model-factory.shards/v2"
ALIGN = 64
KINDS = ("ndarray", "bytes", "str")
ROLES = ("input", "target", "id", "extra")


# A table manifest with this key true holds its features as the source gave them: the manifest's
# ``normalisation`` (the training split's mean and std) is applied when samples are read, not
# baked into the shards. So a shard's bytes depend on its own rows only, and a version that adds
# rows keeps the shards it shares with the previous one, whose statistics then change
# (assets/sharding.py). Manifests without the key hold normalised features, as before.
NORMALISE_ON_READ = "normalise_on_read"


class ShardFormatError(ValueError):
    """A column declaration, a batch of samples or a shard file that does not fit the format."""


@dataclass(frozen=True)
class Column:
    """One typed column. ``shape`` and ``dtype`` apply to ``ndarray`` columns only."""

    name: str
    kind: str
    role: str = "input"
    dtype: str = ""
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ShardFormatError(f"column {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.role not in ROLES:
            raise ShardFormatError(f"column {self.name!r}: role {self.role!r} is not one of {ROLES}")
        if self.kind == "ndarray":
            try:
                dt = np.dtype(self.dtype)
            except TypeError as exc:
                raise ShardFormatError(f"column {self.name!r}: {self.dtype!r} is not a numpy dtype") from exc
            if dt.hasobject or dt.kind not in "biuf":
                raise ShardFormatError(f"column {self.name!r}: dtype {self.dtype!r} must be a bool, integer or "
                                       "float type (use kind 'bytes' or 'str' for anything else)")
            if any(int(d) < 1 for d in self.shape):
                raise ShardFormatError(f"column {self.name!r}: shape {self.shape} has a dimension below 1")

    @property
    def sample_bytes(self) -> int:
        """Bytes per sample of an ndarray column (0 for variable-length columns)."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize if self.kind == "ndarray" else 0

    def to_dict(self) -> dict:
        out = {"name": self.name, "kind": self.kind, "role": self.role}
        if self.kind == "ndarray":
            out.update(dtype=np.dtype(self.dtype).name, shape=list(self.shape))
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "Column":
        return cls(name=d["name"], kind=d["kind"], role=d.get("role", "input"), dtype=d.get("dtype", ""),
                   shape=tuple(d.get("shape", ())))


def as_v2(manifest: Mapping) -> dict:
    """The manifest as shard format v2 describes it: a v2 manifest as it is; a v1 manifest with
    its two blocks named as columns (``features`` float32 of ``feature_shape``, role input;
    ``label`` int64, role target) and each shard's block offsets, every other key kept. The files
    are the same, so the sha256 and sizes of the manifest still check them."""
    fmt = manifest.get("format")
    if fmt == FORMAT_V2:
        return dict(manifest)
    if fmt != FORMAT_V1:
        raise ShardFormatError(f"manifest format {fmt!r} is neither {FORMAT_V1!r} nor {FORMAT_V2!r}")
    try:
        shape = tuple(int(d) for d in manifest["feature_shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise ShardFormatError(f"v1 manifest: feature_shape {manifest.get('feature_shape')!r} is not a list of "
                               "ints") from e
    for key, want in (("feature_dtype", "float32"), ("label_dtype", "int64")):
        if manifest.get(key, want) != want:
            raise ShardFormatError(f"v1 manifest: {key} is {manifest[key]!r}; shard format v1 holds {want} only")
    columns = [Column("features", "ndarray", role="input", dtype="float32", shape=shape),
               Column("label", "ndarray", role="target", dtype="int64")]
    typed = {**manifest, "format": FORMAT_V2, "kind": "table", "task": "classification",
             "columns": [c.to_dict() for c in columns], "stored_as": FORMAT_V1}
    if "splits" in manifest:  # a model card's manifest has none: only the columns matter there
        typed["splits"] = _v1_splits(manifest["splits"], shape, columns[0].sample_bytes)
    return typed


def _v1_splits(v1_splits: Mapping, shape: tuple[int, ...], feature_bytes: int) -> dict:
    """A v1 manifest's splits, each shard entry with the offsets of its features and labels."""
    splits = {}
    try:
        for name, split in v1_splits.items():
            entries = []
            for entry in split["shards"]:
                n = int(entry["num_samples"])
                if entry["num_bytes"] != n * (feature_bytes + 8):
                    raise ShardFormatError(
                        f"v1 shard {entry['path']!r}: the manifest says {entry['num_bytes']} bytes, but {n} samples "
                        f"of {list(shape)} float32 features and an int64 label take {n * (feature_bytes + 8)}; the "
                        "manifest does not describe this shard")
                entries.append({**entry, "columns": {"features": {"offset": 0, "num_bytes": n * feature_bytes},
                                                     "label": {"offset": n * feature_bytes, "num_bytes": n * 8}}})
            splits[name] = {**split, "shards": entries}
    except KeyError as e:
        raise ShardFormatError(f"v1 manifest: a split or shard entry has no {e.args[0]!r}") from e
    return splits


def read_normalisation(manifest: Mapping) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Column -> (mean, std), float32 over the flattened sample, that a reader applies as
    ``(x - mean) / std`` (the float32 arithmetic the shards of older manifests were written with);
    empty unless the manifest says ``NORMALISE_ON_READ``."""
    if not manifest.get(NORMALISE_ON_READ):
        return {}
    norm = manifest.get("normalisation") or {}
    try:
        mean, std = (np.asarray(norm[k], dtype=np.float32).reshape(-1) for k in ("mean", "std"))
    except (KeyError, TypeError, ValueError) as e:
        raise ShardFormatError(f"manifest says {NORMALISE_ON_READ} but its normalisation {norm!r} has no "
                               "mean and std lists") from e
    width = math.prod(int(d) for d in manifest.get("feature_shape") or [len(mean)])
    if mean.shape != (width,) or std.shape != (width,) or not (np.isfinite(mean).all() and (std > 0).all()):
        raise ShardFormatError(f"manifest normalisation needs {width} finite means and positive stds "
                               f"(got {mean.shape[0]} and {std.shape[0]})")
    return {"features": (mean, std)}


def columns_from_manifest(manifest: Mapping) -> list[Column]:
    if manifest.get("format") != FORMAT_V2:
        raise ShardFormatError(f"manifest format {manifest.get('format')!r} is not {FORMAT_V2!r}")
    return [Column.from_dict(c) for c in manifest["columns"]]


def _pad(n: int) -> int:
    return -n % ALIGN


@dataclass
class ShardWriter:
    """Writes one shard file from whole columns; ``write`` returns the manifest entry."""

    columns: Sequence[Column]
    _names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self._names = [c.name for c in self.columns]
        if len(set(self._names)) != len(self._names):
            raise ShardFormatError(f"columns {self._names} name one column twice")

    def write(self, path: Path, rel: str, samples: Mapping[str, object]) -> dict:
        """Write ``samples`` (column name -> ndarray, or list of bytes/str) to ``path``."""
        missing = [n for n in self._names if n not in samples]
        if missing:
            raise ShardFormatError(f"shard {rel!r}: no values for column(s) {missing}")
        counts = {c.name: len(samples[c.name]) for c in self.columns}  # type: ignore[arg-type]
        if len(set(counts.values())) != 1:
            raise ShardFormatError(f"shard {rel!r}: columns hold different sample counts {counts}")
        n = next(iter(counts.values()), 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        blocks: dict[str, dict] = {}
        with open(path, "wb") as f:
            def put(data) -> None:
                digest.update(data)
                f.write(data)

            for col in self.columns:
                start = f.tell()
                for chunk in _encode(col, samples[col.name], rel):
                    put(chunk)
                blocks[col.name] = {"offset": start, "num_bytes": f.tell() - start}
                put(b"\0" * _pad(f.tell()))
            size = f.tell()
        return {"path": rel, "num_samples": n, "sha256": digest.hexdigest(), "num_bytes": size, "columns": blocks}


def _encode(col: Column, values, rel: str):
    if col.kind == "ndarray":
        arr = np.asarray(values)
        want = (len(arr), *col.shape)
        if arr.shape != want:
            raise ShardFormatError(f"shard {rel!r} column {col.name!r}: got shape {arr.shape}, declared {want}")
        yield np.ascontiguousarray(arr, dtype=np.dtype(col.dtype).newbyteorder("<")).data
        return
    payloads = [v.encode("utf-8") if col.kind == "str" else bytes(v) for v in values]
    offsets = np.zeros(len(payloads) + 1, dtype="<u8")
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    yield offsets.data
    yield b"".join(payloads)


class ShardColumns:
    """One shard file memory-mapped: each ndarray column a zero-copy view, each variable-length
    column its offsets and payload views."""

    def __init__(self, path: Path, entry: Mapping, columns: Sequence[Column]):
        self.path = Path(path)
        self.num_samples = int(entry["num_samples"])
        size = self.path.stat().st_size
        if size != entry["num_bytes"]:
            raise ShardFormatError(f"shard {entry['path']!r} holds {size} bytes, the manifest says "
                                   f"{entry['num_bytes']}")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        self.arrays: dict[str, np.ndarray] = {}
        self.offsets: dict[str, np.ndarray] = {}
        self.payloads: dict[str, np.ndarray] = {}
        n = self.num_samples
        for col in columns:
            block = entry["columns"][col.name]
            raw = self._map[block["offset"]:block["offset"] + block["num_bytes"]]
            if col.kind == "ndarray":
                if len(raw) != n * col.sample_bytes:
                    raise ShardFormatError(f"shard {entry['path']!r} column {col.name!r}: {len(raw)} bytes, "
                                           f"expected {n * col.sample_bytes}")
                self.arrays[col.name] = raw.view(np.dtype(col.dtype).newbyteorder("<")).reshape(n, *col.shape)
            else:
                if len(raw) < (n + 1) * 8:
                    raise ShardFormatError(f"shard {entry['path']!r} column {col.name!r}: {len(raw)} bytes, too "
                                           f"few for the offset index of {n} samples")
                offsets = raw[:(n + 1) * 8].view("<u8")
                self.offsets[col.name] = offsets
                self.payloads[col.name] = raw[(n + 1) * 8:]
                # Offsets must start at 0, never decrease and end at the payload's length: a
                # reader slices payloads by them without further checks.
                if (int(offsets[0]) != 0 or int(offsets[-1]) != len(self.payloads[col.name])
                        or bool(np.any(offsets[1:] < offsets[:-1]))):
                    raise ShardFormatError(f"shard {entry['path']!r} column {col.name!r}: the offset index does "
                                           "not match its payload")

    def value(self, column: str, i: int) -> bytes:
        """Sample ``i`` of a variable-length column."""
        o = self.offsets[column]
        return self.payloads[column][int(o[i]):int(o[i + 1])].tobytes()

