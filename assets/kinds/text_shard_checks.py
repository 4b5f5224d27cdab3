"""Checks on text shards just written: counts and document fractions per split, every shard's
checksum and token ids, full windows (language modelling), labels and lengths (classification),
and the tokenizer file (BPE).

Each shard file is memory-mapped and read once, except those of a corpus's parts that the
published version made (marked ``CARRIED``): they were read back and checked when it was made,
and its parts' records give their figures; per-split and per-shard figures go into two
small tables that Great Expectations validates, and every problem is also named in plain words
with the file it was found in.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd

from assets.kinds.text_tokens import BpeTokenizer
from assets.quality.runner import QualityReport, run_suite
from assets.sharding import CARRIED, SPLITS
from core.spec import PipelineSpec
from training_runtime.data.shard_format import ShardColumns, ShardFormatError, columns_from_manifest

# A seeded hash split of n documents puts a share p of them in a split give or take
# sqrt(p(1 - p) / n); allow four of those (a false alarm about once in 15,000 datasets) or
# MIN_FRACTION_TOLERANCE, whichever is larger.
FRACTION_SIGMAS = 4.0
MIN_FRACTION_TOLERANCE = 0.05


def fraction_tolerance(expected: float, documents: int) -> float:
    return max(MIN_FRACTION_TOLERANCE, FRACTION_SIGMAS * math.sqrt(expected * (1 - expected) / max(documents, 1)))


def check_text_shards(spec: PipelineSpec, manifest: dict, out_dir: Path) -> QualityReport:
    problems: list[str] = []
    vocab = int(manifest["tokenizer"]["vocab_size"])
    problems += _tokenizer_problems(manifest, out_dir)
    shard_rows = []
    kept = _kept_figures(manifest)
    for split in SPLITS:
        body = manifest["splits"][split]
        for entry in body["shards"]:
            if entry.get(CARRIED):  # read and checked when the version that made it was
                shard_rows.append({"split": split, "path": entry["path"], "samples": entry["num_samples"],
                                   **kept[entry["path"]]})
                continue
            row, found = _shard_figures(manifest, out_dir, split, entry)
            shard_rows.append(row)
            problems += found
        problems += _count_problems(manifest, split, body)
    split_table = _split_table(manifest)
    for row in split_table.itertuples():
        if row.fraction_error > row.tolerance:
            problems.append(f"split {row.split}: {row.documents} of {split_table['documents'].sum()} documents "
                            f"({row.fraction:.3f}), expected {row.expected:.3f} +- {row.tolerance:.3f}")
    shards = pd.DataFrame(shard_rows, columns=["split", "path", "samples", "checksum_ok", "readable",
                                               "max_token", "full_windows", "min_label", "max_label"])
    report = run_suite(f"{spec.name}/shards", _suite(manifest, vocab), {"splits": split_table, "shards": shards})
    return QualityReport(report.asset, report.outcomes, problems)


def _kept_figures(manifest: dict) -> dict[str, dict]:
    """The shards table's figures of each shard of the manifest's parts, from the part's record
    (its split's largest token id and labels): what a kept shard is judged by."""
    out = {}
    for part in manifest.get("parts", []):
        for info in part["splits"].values():
            row = {"checksum_ok": True, "readable": True, "max_token": info["max_token"], "full_windows": True,
                   "min_label": info.get("min_label", 0), "max_label": info.get("max_label", 0)}
            out.update({path: row for path in info["shards"]})
    return out


def _suite(manifest: dict, vocab: int) -> dict[str, list]:
    import great_expectations as gx

    E = gx.expectations
    shards = [E.ExpectColumnValuesToBeInSet(column="checksum_ok", value_set=[True]),
              E.ExpectColumnValuesToBeInSet(column="readable", value_set=[True]),
              E.ExpectColumnValuesToBeBetween(column="max_token", min_value=0, max_value=vocab - 1),
              E.ExpectColumnValuesToBeInSet(column="full_windows", value_set=[True])]
    if manifest["task"] == "classification":
        shards += [E.ExpectColumnValuesToBeBetween(column="min_label", min_value=0),
                   E.ExpectColumnValuesToBeBetween(column="max_label", max_value=manifest["num_classes"] - 1)]
    splits = [E.ExpectColumnDistinctValuesToEqualSet(column="split", value_set=list(SPLITS)),
              E.ExpectColumnValuesToBeBetween(column="samples", min_value=1),
              E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="tolerance", column_B="fraction_error",
                                                        or_equal=True)]
    return {"splits": splits, "shards": shards}


def _split_table(manifest: dict) -> pd.DataFrame:
    fractions = manifest["split"]["fractions"]
    documents = {s: int(manifest["splits"][s]["num_documents"]) for s in SPLITS}
    total = sum(documents.values())
    rows = []
    for split in SPLITS:
        fraction = documents[split] / total if total else 0.0
        rows.append({"split": split, "documents": documents[split], "samples": manifest["splits"][split]["num_samples"],
                     "fraction": fraction, "expected": fractions[split],
                     "fraction_error": abs(fraction - fractions[split]),
                     "tolerance": fraction_tolerance(fractions[split], total)})
    return pd.DataFrame(rows)


def _count_problems(manifest: dict, split: str, body: dict) -> list[str]:
    problems = []
    in_files = sum(e["num_samples"] for e in body["shards"])
    if in_files != body["num_samples"]:
        problems.append(f"split {split}: its shard files hold {in_files} samples, the manifest says "
                        f"{body['num_samples']}")
    if body["num_samples"] == 0:
        what = f"no window of seq_len + 1 = {manifest['preprocessing']['seq_len'] + 1} tokens" \
            if manifest["task"] == "language_modeling" else "no samples"
        problems.append(f"split {split}: {body['num_documents']} document(s), {body.get('stream_tokens', 0)} "
                        f"token(s): {what}; add text or lower seq_len")
    if manifest["task"] == "language_modeling":
        width = manifest["preprocessing"]["seq_len"] + 1
        if body["num_tokens"] != body["num_samples"] * width or \
                body["num_tokens"] + body["dropped_tokens"] != body["stream_tokens"]:
            problems.append(f"split {split}: {body['stream_tokens']} tokens in the stream, but {body['num_samples']} "
                            f"windows of {width} and {body['dropped_tokens']} dropped")
    return problems


def _shard_figures(manifest: dict, out_dir: Path, split: str, entry: dict) -> tuple[dict, list[str]]:
    """One row of the shards table, and the problems found in that shard file."""
    rel = entry["path"]
    row = {"split": split, "path": rel, "samples": entry["num_samples"], "checksum_ok": False, "readable": False,
           "max_token": 0, "full_windows": False, "min_label": 0, "max_label": 0}
    path = out_dir / rel
    if not path.is_file():
        return row, [f"shard {rel}: the file is missing"]
    digest = _sha256(path)
    row["checksum_ok"] = digest == entry["sha256"]
    problems = [] if row["checksum_ok"] else [f"shard {rel}: sha256 {digest[:12]}... differs from its manifest entry "
                                              f"{entry['sha256'][:12]}..."]
    try:
        shard = ShardColumns(path, entry, columns_from_manifest(manifest))
    except ShardFormatError as exc:
        return row, problems + [f"shard {rel}: cannot be read: {exc}"]
    row["readable"] = True
    problems += _token_problems(manifest, rel, shard, row)
    return row, problems


def _token_problems(manifest: dict, rel: str, shard: ShardColumns, row: dict) -> list[str]:
    tokens = shard.arrays["tokens"]
    tok = manifest["tokenizer"]
    vocab, pad = tok["vocab_size"], tok["pad_id"]
    problems = []
    row["max_token"] = int(tokens.max()) if tokens.size else 0
    if tokens.size and (row["max_token"] >= vocab or int(tokens.min()) < 0):
        problems.append(f"shard {rel}: token ids from {int(tokens.min())} to {row['max_token']}, outside the "
                        f"vocabulary 0..{vocab - 1}")
    if manifest["task"] == "language_modeling":
        width = manifest["preprocessing"]["seq_len"] + 1
        padded = int((tokens == pad).any(axis=1).sum()) if tokens.size else 0
        row["full_windows"] = tokens.shape[1:] == (width,) and padded == 0
        if not row["full_windows"]:
            problems.append(f"shard {rel}: windows of shape {tokens.shape[1:]} with {padded} holding the pad id; "
                            f"every window must be {width} real tokens")
        return problems
    lengths, labels = shard.arrays["length"], shard.arrays["label"]
    row["min_label"] = int(labels.min()) if labels.size else 0
    row["max_label"] = int(labels.max()) if labels.size else 0
    if labels.size and (row["min_label"] < 0 or row["max_label"] >= manifest["num_classes"]):
        problems.append(f"shard {rel}: labels from {row['min_label']} to {row['max_label']}, outside "
                        f"0..{manifest['num_classes'] - 1}")
    beyond = np.arange(tokens.shape[1])[None, :] >= lengths[:, None]
    row["full_windows"] = bool(((tokens == pad) == beyond).all()) if tokens.size else True
    if not row["full_windows"]:
        problems.append(f"shard {rel}: padding does not match the length column (pad id {pad} inside a document, "
                        "or a real token after its length)")
    return problems


def _tokenizer_problems(manifest: dict, out_dir: Path) -> list[str]:
    tok = manifest["tokenizer"]
    if tok["kind"] != "bpe":
        return []
    path = out_dir / tok["path"]
    if not path.is_file():
        return [f"tokenizer {tok['path']}: the file is missing"]
    problems = []
    if _sha256(path) != tok["sha256"]:
        problems.append(f"tokenizer {tok['path']}: sha256 differs from the manifest's")
    try:
        loaded = BpeTokenizer.load(path)
    except Exception as exc:  # the library raises its own exception types for a file it cannot parse
        return problems + [f"tokenizer {tok['path']}: does not load: {type(exc).__name__}: {exc}"]
    found = {"vocab_size": loaded.vocab_size, "eos_id": loaded.eos_id, "pad_id": loaded.pad_id}
    wanted = {k: tok[k] for k in found}
    if found != wanted:
        problems.append(f"tokenizer {tok['path']}: loads as {found}, the manifest says {wanted}")
    return problems


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_part_files(header: dict, entries: list[dict[str, list[dict]]], out_dir: Path) -> list[str]:
    """The problems of the shard files a step of the shards asset wrote to ``out_dir`` for its
    parts (``entries``: each part's shard entries per split), read back as ``check_text_shards``
    reads a shard it did not carry: checksum, format, token ids, windows, labels. The publish
    step then judges them by their parts' records, as it judges the published version's."""
    problems = []
    for part in entries:
        for split, split_entries in part.items():
            for entry in split_entries:
                problems += _shard_figures(header, out_dir, split, entry)[1]
    return problems
