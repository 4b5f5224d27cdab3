"""The raw copy of an image folder preprocessed into shards (format v2) and their manifest.

One pass over each part of the raw copy (assets/kinds/image_parts.py), row group by row group:
each image's split comes from a seeded hash of its id, its pixels from the worker pool, and it
is appended to its part's open shard of its split, written out when full or when the part ends
(``<split>/<part name>-<n>.bin``). Each part is in id order, so each part's samples of a split
are in id order and the order the source listed them in changes nothing. Memory
holds the tasks in flight and one open shard per split (``shard_mb`` each), not the dataset. The
parts the previous version already sharded keep their shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from assets.kinds.image_decode import BACKGROUND, load_function, preprocessing_code_sha256, sample_shape
from assets.kinds.image_parts import INDEX_NAME, read_index
from assets.kinds.image_pool import WorkerPool, preprocess_task, task_size, workers_for
from assets.sharding import CARRIED, SPLITS, assign_splits
from core.spec import ImagePreprocessing, PipelineSpec
from training_runtime.data.shard_format import FORMAT_V2, Column, ShardWriter

SPLIT_BY = "id (the image's path relative to the image folder)"


def preprocessing_of(spec: PipelineSpec) -> ImagePreprocessing:
    return spec.preprocessing or ImagePreprocessing()


def shard_columns(prep: ImagePreprocessing) -> list[Column]:
    image = (Column("jpeg", "bytes", role="input") if prep.encoded
             else Column("image", "ndarray", role="input", dtype="uint8", shape=sample_shape(prep)))
    return [image, Column("label", "ndarray", role="target", dtype="int64"), Column("id", "str", role="id")]


class _OpenShard:
    """The samples of one split waiting for their shard file; written when full."""

    def __init__(self, split: str, out_dir: Path, writer: ShardWriter, prep: ImagePreprocessing,
                 max_samples: int | None, max_bytes: int | None, part: str):
        self.split, self.out_dir, self.writer, self.prep = split, out_dir, writer, prep
        self.max_samples, self.max_bytes, self.part = max_samples, max_bytes, part
        self.entries: list[dict] = []
        self.num_samples = 0
        self.label_counts: dict[str, int] = {}  # label index (as text: JSON keys) -> samples, for the checks
        self._reset()

    def _reset(self) -> None:
        self.ids: list[str] = []
        self.labels: list[int] = []
        self.jpegs: list[bytes] = []
        self.bytes = 0
        self.pixels = np.empty((0, *sample_shape(self.prep)), np.uint8)

    def add_jpeg(self, image_id: str, label: int, jpeg: bytes) -> None:
        self.jpegs.append(jpeg)
        self.bytes += len(jpeg) + 8
        self.ids.append(image_id)
        self.labels.append(label)
        full_count = self.max_samples is not None and len(self.ids) >= self.max_samples
        if full_count or (self.max_bytes is not None and self.bytes >= self.max_bytes):
            self.flush()

    def add_pixels(self, ids: list[str], labels: list[int], pixels: np.ndarray) -> None:
        """Samples of pixels (n, h, w, c), copied in blocks up to each shard's end:
        a slice of the task's array per shard rather than a Python call per sample (0.08 s of the
        sharding process's CPU for 4,096 images, on cores the workers need)."""
        done = 0
        while done < len(ids):
            self._grow()
            room = len(self.pixels) - len(self.ids)
            take = min(room, len(ids) - done)
            self.pixels[len(self.ids):len(self.ids) + take] = pixels[done:done + take]
            self.ids += ids[done:done + take]
            self.labels += labels[done:done + take]
            done += take
            if len(self.ids) >= self.max_samples:
                self.flush()

    def _grow(self) -> None:
        """Room for one more sample: the whole shard's buffer, allocated once when its first sample
        arrives. Linux backs only the pages written, so a shard sized for 64 MB costs what it holds,
        and there is no doubling that copies it and holds two copies at once (benchmarks/, row 8d)."""
        if not len(self.pixels):
            self.pixels = np.empty((self.max_samples, *self.pixels.shape[1:]), np.uint8)

    def flush(self) -> None:
        n = len(self.ids)
        if not n:
            return
        rel = f"{self.split}/{self.part}-{len(self.entries):05d}.bin"
        image = self.jpegs if self.prep.encoded else self.pixels[:n]
        name = "jpeg" if self.prep.encoded else "image"
        self.entries.append(self.writer.write(self.out_dir / rel, rel, {
            name: image, "label": np.asarray(self.labels, dtype=np.int64), "id": self.ids}))
        self.num_samples += n
        for label in self.labels:
            self.label_counts[str(label)] = self.label_counts.get(str(label), 0) + 1
        self._reset()


def shard_capacity(spec: PipelineSpec, prep: ImagePreprocessing) -> tuple[int | None, int | None]:
    """(samples, bytes) a shard takes at most. Pixels have a fixed size, so a count
    (``split.shard_samples``); JPEGs vary, so their shards are cut at ``shard_mb`` unless
    ``samples_per_shard`` fixes the count."""
    if not prep.encoded:
        h, w, c = sample_shape(prep)
        return spec.split.shard_samples(h * w * c + 8), None
    if spec.split.samples_per_shard is not None:
        return spec.split.samples_per_shard, None
    return None, int(spec.split.shard_mb * 2**20)


def shard_images(spec: PipelineSpec, raw_dir: Path, out_dir: Path, workers: int | None = None,
                 previous: dict | None = None) -> dict:
    """The shards of the raw copy under ``raw_dir`` (its ``parts.json`` and the parts it lists) and
    their manifest. A part whose key ``previous`` (the previous version's manifest) lists keeps
    that version's shards: their entries are carried over, and nothing of it is read or written.
    Every other part is read from ``raw_dir`` and sharded on its own: a shard never holds two
    parts, so a part's shards depend on that part alone."""
    prep = preprocessing_of(spec)
    function = load_function(prep.function) if prep.function else None  # import errors: ValueError, here
    code_sha256 = preprocessing_code_sha256(prep, function)
    columns = shard_columns(prep)
    writer = ShardWriter(columns)
    max_samples, max_bytes = shard_capacity(spec, prep)
    fractions = (spec.split.train, spec.split.validation, spec.split.test)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = read_index((raw_dir / INDEX_NAME).read_bytes())["parts"]
    kept = {p["key"]: p for p in (previous or {}).get("parts", [])}
    kept_entries = {e["path"]: e for info in (previous or {}).get("splits", {}).values() for e in info["shards"]}
    made: dict[int, dict[str, _OpenShard]] = {}
    new = [i for i, p in enumerate(parts) if p["key"] not in kept]
    with WorkerPool(workers_for(sum(parts[i]["rows"] for i in new), workers)) as pool:
        jobs = _jobs(spec, prep, raw_dir, [(i, parts[i]) for i in new], fractions, pool.workers)
        for (i, ids, labels, codes), samples in pool.ordered(preprocess_task, jobs):
            if i not in made:
                for shard in (made[max(made)].values() if made else ()):  # the previous part is complete
                    shard.flush()
                made[i] = {s: _OpenShard(s, out_dir, writer, prep, max_samples, max_bytes, parts[i]["name"])
                           for s in SPLITS}
            shards = made[i]
            if prep.encoded:
                for image_id, label, code, sample in zip(ids, labels, codes, samples):
                    shards[SPLITS[code]].add_jpeg(image_id, label, sample)
                continue
            codes = np.asarray(codes)
            for code in np.unique(codes):  # each split's samples of the slice, in their order
                where = np.flatnonzero(codes == code)
                shards[SPLITS[code]].add_pixels([ids[j] for j in where], [labels[j] for j in where],
                                                samples[where])
    for shards in made.values():
        for shard in shards.values():
            shard.flush()
    splits = {s: {"num_samples": 0, "shards": []} for s in SPLITS}
    part_records = []
    for i, part in enumerate(parts):
        if i in made:
            record = {"key": part["key"], "name": part["name"], "first_id": part["first_id"],
                      "last_id": part["last_id"],
                      "splits": {s: {"num_samples": made[i][s].num_samples, "label_counts": made[i][s].label_counts,
                                     "shards": [e["path"] for e in made[i][s].entries]} for s in SPLITS}}
            entries = {s: made[i][s].entries for s in SPLITS}
        else:
            record = kept[part["key"]]
            entries = {s: [_carried(kept_entries, path) for path in record["splits"][s]["shards"]] for s in SPLITS}
        part_records.append(record)
        for s in SPLITS:
            splits[s]["shards"] += entries[s]
            splits[s]["num_samples"] += record["splits"][s]["num_samples"]
    return {
        "format": FORMAT_V2,
        "kind": "images",
        "columns": [c.to_dict() for c in columns],
        "task": spec.task,
        "class_names": list(spec.class_names),
        "num_classes": len(spec.class_names),
        "sample_shape": list(sample_shape(prep)),
        "preprocessing": _describe(prep, code_sha256),
        "split": {"seed": spec.split.seed, "fractions": dict(zip(SPLITS, fractions)), "by": SPLIT_BY},
        "shard_size": {"max_samples": max_samples, "max_bytes": max_bytes},
        "splits": splits,
        "parts": part_records,
    }


def carried_shards(manifest: dict) -> set[str]:
    """Paths of the manifest's shards that a previous version made (``shard_images`` marks them)."""
    return {e["path"] for info in manifest["splits"].values() for e in info["shards"] if e.get(CARRIED)}




def _carried(entries: dict[str, dict], path: str) -> dict:
    if path not in entries:
        raise ValueError(f"the previous version's manifest lists shard {path!r} in its parts but not in its splits; "
                         "re-materialise the shards without reuse")
    return {**entries[path], CARRIED: True}


def _jobs(spec: PipelineSpec, prep: ImagePreprocessing, raw_dir: Path, parts: list[tuple[int, dict]],
          fractions: tuple[float, float, float], workers: int) -> Iterator[tuple[tuple, tuple]]:
    """(part index, ids, label indices, split codes) and the worker's task, slice by slice of each
    row group of each part to shard."""
    import pyarrow.parquet as pq

    class_index = {c: i for i, c in enumerate(spec.class_names)}
    limit = Image.MAX_IMAGE_PIXELS
    for index_, part in parts:
        last_id = None
        path = raw_dir / part["raw"]
        if not path.is_file():
            raise ValueError(f"part {part['name']} of the raw copy ({part['raw']}) is not there to shard; "
                             "re-materialise the raw dataset")
        raw = pq.ParquetFile(path)
        for group in range(raw.num_row_groups):
            table = raw.read_row_group(group, columns=["id", "label", "bytes"])
            ids = table.column("id").to_pylist()
            if ids and (last_id is not None and ids[0] <= last_id or any(a >= b for a, b in zip(ids, ids[1:]))):
                raise ValueError(f"the raw copy's part {path.name} is not in strictly increasing id order (row "
                                 f"group {group}); ingest writes it sorted, so it was written by something else")
            last_id = ids[-1] if ids else last_id
            labels = [_label_index(class_index, label, i) for label, i in zip(table.column("label").to_pylist(), ids)]
            codes = assign_splits(pd.Series(ids, dtype=str), spec.split.seed, fractions).tolist()
            contents = table.column("bytes").to_pylist()
            del table
            step = task_size(len(ids), workers)
            for s in range(0, len(ids), step):
                e = s + step
                yield (index_, ids[s:e], labels[s:e], codes[s:e]), (prep, ids[s:e], contents[s:e], limit)


def _label_index(class_index: dict[str, int], label: str, image_id: str) -> int:
    if label not in class_index:
        raise ValueError(f"image {image_id!r} has the label {label!r}, not one of the classes {list(class_index)}")
    return class_index[label]


def _describe(prep: ImagePreprocessing, code_sha256: str) -> dict:
    out = {"kind": "image", "size": list(prep.size), "fit": prep.fit, "channels": prep.channels,
           "encoded": prep.encoded, "jpeg_quality": prep.jpeg_quality, "function": prep.function,
           "code_sha256": code_sha256, "libraries": {"pillow": version("pillow")}}
    if prep.encoded:
        out["libraries"]["simplejpeg"] = version("simplejpeg")
        out["jpeg_subsampling"] = "4:2:0 (colour), grayscale for L"
    if prep.function is None:
        out.update(resample="bilinear (antialiased)", exif_orientation="applied",
                   transparency=f"composited on ({BACKGROUND}, {BACKGROUND}, {BACKGROUND})")
    return out
