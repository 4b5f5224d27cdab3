"""Checks on the image shards just written: counts and fractions per split, labels, checksums,
the id order (within each part), and that JPEG samples decode to the declared size.

The shard files are read back through ``training_runtime.data.shard_format.ShardColumns``, as the
training loader reads them. Great Expectations validates two tables (``samples``: split and
label of every sample; ``splits``: one row per split); what only a file can tell (a checksum,
a sample that does not decode) is a plain failure naming the shard and the sample.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from assets.kinds.image_decode import decode_jpeg
from assets.kinds.image_shards import CARRIED
from assets.quality.runner import QualityReport, run_suite
from assets.sharding import SPLITS
from assets.source import file_sha256
from core.spec import PipelineSpec
from training_runtime.data.shard_format import ShardColumns, ShardFormatError, columns_from_manifest

MIN_FRACTION_TOLERANCE = 0.05
DECODED_PER_SHARD = 3  # JPEG samples decoded per shard: first, middle and last


def fraction_tolerance(expected: float, total: int) -> float:
    """How far a split's share may stray from its fraction: 0.05, or three binomial standard
    deviations when the dataset is small enough for chance alone to stray further."""
    return max(MIN_FRACTION_TOLERANCE, 3 * math.sqrt(expected * (1 - expected) / max(1, total)))


def shard_suite(num_classes: int) -> dict[str, list]:
    import great_expectations as gx

    E = gx.expectations
    return {
        "samples": [E.ExpectColumnValuesToBeBetween(column="label", min_value=0, max_value=num_classes - 1),
                    E.ExpectColumnDistinctValuesToEqualSet(column="train_label", value_set=list(range(num_classes)))],
        "splits": [E.ExpectColumnValuesToBeBetween(column="num_samples", min_value=1),
                   E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="tolerance", column_B="fraction_error",
                                                             or_equal=True),
                   E.ExpectColumnValuesToBeInSet(column="counts_match", value_set=[True]),
                   E.ExpectColumnValuesToBeInSet(column="checksums_ok", value_set=[True]),
                   E.ExpectColumnValuesToBeInSet(column="decodes_ok", value_set=[True])],
    }


def check_image_shards(spec: PipelineSpec, manifest: dict, out_dir: Path) -> QualityReport:
    """The shards under ``out_dir`` read back and checked; a shard the previous version made and
    this one carries over (``CARRIED``) was read back and checked when that version was made, from
    the same part of the same files under the same parameters and code (the part's key says so):
    it counts here by its part's record (samples and labels per split, its range of ids), and the
    trainer verifies its sha256 when it fetches it."""
    columns = columns_from_manifest(manifest)
    encoded = manifest["preprocessing"]["encoded"]
    shape = tuple(manifest["sample_shape"])
    channels = manifest["preprocessing"]["channels"]
    failures: list[str] = []
    total = sum(info["num_samples"] for info in manifest["splits"].values())
    part_of = {path: part for part in manifest.get("parts", []) for info in part["splits"].values()
               for path in info["shards"]}
    split_rows, samples = [], []
    for split in SPLITS:
        info = manifest["splits"].get(split, {"num_samples": 0, "shards": []})
        counted, checksums_ok, decodes_ok, last_id, in_part = 0, True, True, None, None
        counted_parts: set[str] = set()
        for entry in info["shards"]:
            part = part_of.get(entry["path"])
            if part is not None and part["key"] != in_part:  # ids increase within a part's shards
                last_id, in_part = None, part["key"]
            if entry.get(CARRIED):
                counted += entry["num_samples"]
                if part["key"] not in counted_parts:  # a part's labels once, however many shards it has
                    counted_parts.add(part["key"])
                    counts = part["splits"][split]["label_counts"]
                    samples.append(pd.DataFrame({"split": split, "label": np.repeat(
                        np.array([int(k) for k in counts], dtype=np.int64), [counts[k] for k in counts])}))
                continue
            path = out_dir / entry["path"]
            digest = file_sha256(path)
            if digest != entry["sha256"]:
                checksums_ok = False
                failures.append(f"{entry['path']}: sha256 {digest} differs from its manifest entry {entry['sha256']}")
            try:
                shard = ShardColumns(path, entry, columns)
            except ShardFormatError as exc:
                checksums_ok = False
                failures.append(f"{entry['path']}: cannot be read back: {exc}")
                continue
            counted += shard.num_samples
            labels = np.array(shard.arrays["label"], dtype=np.int64)
            samples.append(pd.DataFrame({"split": split, "label": labels}))
            ids = [shard.value("id", i).decode() for i in range(shard.num_samples)]
            in_order = ([last_id] if last_id is not None else []) + ids
            if any(a >= b for a, b in zip(in_order, in_order[1:])):
                failures.append(f"{entry['path']}: samples are not in increasing id order")
            last_id = ids[-1] if ids else last_id
            if encoded:
                bad = _undecodable(shard, ids, shape, channels)
                decodes_ok &= not bad
                failures += [f"{entry['path']}: {b}" for b in bad]
        expected = manifest["split"]["fractions"][split]
        fraction = info["num_samples"] / total if total else 0.0
        split_rows.append({"split": split, "num_samples": info["num_samples"], "fraction": fraction,
                           "expected_fraction": expected, "fraction_error": abs(fraction - expected),
                           "tolerance": fraction_tolerance(expected, total), "counts_match": counted ==
                           info["num_samples"], "checksums_ok": checksums_ok, "decodes_ok": decodes_ok})
    tables = {"samples": _samples_table(samples), "splits": pd.DataFrame(split_rows)}
    failures += _plain_failures(tables, manifest["class_names"])
    report = run_suite(f"{spec.name}/shards", shard_suite(len(manifest["class_names"])), tables)
    return QualityReport(report.asset, report.outcomes, failures)


def _undecodable(shard: ShardColumns, ids: list[str], shape: tuple[int, ...], channels: str) -> list[str]:
    """First, middle and last samples of an encoded shard that do not decode to ``shape``."""
    bad = []
    for i in sorted({0, shard.num_samples // 2, shard.num_samples - 1} & set(range(shard.num_samples))):
        try:
            got = decode_jpeg(shard.value("jpeg", i), channels).shape
        except ValueError as exc:  # simplejpeg's error for data that is no JPEG
            bad.append(f"sample {i} (id {ids[i]!r}) does not decode: {exc}")
            continue
        if tuple(got) != shape:
            bad.append(f"sample {i} (id {ids[i]!r}) decodes to {tuple(got)}, declared {shape}")
    return bad


def _samples_table(parts: list[pd.DataFrame]) -> pd.DataFrame:
    samples = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"split": pd.Series(dtype=str), "label": pd.Series(dtype="int64")})
    samples["train_label"] = samples["label"].where(samples["split"] == "train")
    return samples


def _plain_failures(tables: dict[str, pd.DataFrame], class_names: list[str]) -> list[str]:
    """What the suite finds, in words: empty splits, fractions off, labels out of range, classes absent from train."""
    out = []
    for row in tables["splits"].itertuples():
        if row.num_samples == 0:
            out.append(f"split {row.split!r} has no samples")
        elif row.fraction_error > row.tolerance:
            out.append(f"split {row.split!r} holds {row.fraction:.1%} of the samples, expected "
                       f"{row.expected_fraction:.0%} ± {row.tolerance:.1%}")
        if not row.counts_match:
            out.append(f"split {row.split!r}: its shards hold a different number of samples than the manifest says")
    labels = tables["samples"]["label"]
    outside = labels[(labels < 0) | (labels >= len(class_names))]
    if len(outside):
        out.append(f"{len(outside)} label(s) outside 0..{len(class_names) - 1}, e.g. {sorted(set(outside))[:5]}")
    in_train = set(tables["samples"]["train_label"].dropna().astype(int))
    out += [f"class {name!r} (label {i}) has no sample in the train split"
            for i, name in enumerate(class_names) if i not in in_train]
    return out


def check_shard_files(spec: PipelineSpec, manifest: dict, out_dir: Path) -> list[str]:
    """What only the files can tell about the shards of ``manifest`` under ``out_dir`` (a sha256,
    a shard that does not read back, ids out of order within a part, a JPEG that does not decode),
    for a step that made some of a version's parts: the split-level checks (fractions, classes
    in train, counts) need every part and run once the steps are done, on the parts' records."""
    paths = {e["path"] for info in manifest["splits"].values() for e in info["shards"] if not e.get(CARRIED)}
    return [f for f in check_image_shards(spec, manifest, out_dir).failures if f.split(": ", 1)[0] in paths]
