"""Text corpora as a ``DataKind``: JSONL and .txt documents -> a Parquet raw copy -> token shards.

- ``ingest`` reads the files ``docs_per_chunk`` documents at a time (text_read.py), refuses what
  cannot be used, naming file, line and problem, and writes the accepted documents row group by
  row group to ``documents.parquet``: ``id`` ("<file>:<line>" or "<file>"), ``text``, ``label``
  (classification only) and ``chars`` (text_ingest.py). A corpus that is the published one grown
  by new files or appended JSONL lines is read by its new documents alone (text_append.py).
- ``shard`` cuts the documents, in the raw copy's order (files by path, lines in file order), into
  content-defined parts (the image folders' cut rule over the ids, assets/kinds/image_parts.py),
  splits them by a seeded hash of their id (before any tokenizing: the BPE sees the training split
  only), and writes each part's documents, after the user's function, tokenized (text_tokens.py),
  to format-v2 shards of its own (text_pack.py: ``<split>/<part name>-<n>.bin``). A part's key is
  the sha256 of the salt (the data key's parameters and code), the tokenizer's identity (its
  file's sha256, or "byte") and its members (id, text sha256, label): a new version keeps every
  part of the published one with the same key, shards and all, and tokenizes only the others.
  Memory holds the documents' ids and hashes, one row group and at most one shard's samples per
  split.
- ``check_shards``: text_shard_checks.py (kept parts' shards by their records, not read again).

A version built on the published one cuts its parts as a build from nothing does and keeps only
parts of the same key, so with the same tokenizer the two give the same manifest and shard bytes.
``shard`` is one call; the shards asset runs its three pieces as Dagster steps
(assets/text_shard_steps.py): ``TextSharder.plan`` (parts, tokenizer), ``write_parts`` on groups
of new parts, each step reading only the raw copy's row groups that hold them, and
``text_manifest``, the assembly both share, so the steps' version is this call's byte for byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from assets.kinds.image_parts import KEY_CHARS, cut_points, part_key
from assets.kinds.text_pack import (
    ShardBuffer,
    WindowPacker,
    classification_columns,
    classification_samples,
    lm_columns,
)
from assets.kinds.text_append import PublishedCorpus, ingest_corpus
from assets.kinds.text_ingest import TEXT_SHA256, TextRawData
from assets.kinds.text_quality import class_names_of
from assets.kinds.text_shard_checks import check_text_shards
from assets.kinds.text_tokens import (
    TOKENIZER_FILE,
    BpeTokenizer,
    ByteTokenizer,
    apply_function,
    preprocessing_record,
    token_dtype,
    user_function,
)
from assets.quality.runner import QualityReport
from assets.sharding import CARRIED, SPLITS, assign_splits
from core.spec import PipelineSpec, TextPreprocessing
from training_runtime.data.shard_format import FORMAT_V2

RAW_NAME = "documents.parquet"
ID_BYTES_ESTIMATE = 32  # a document id's typical UTF-8 size, for sizing shards in bytes


class TextKind:
    raw_name = RAW_NAME
    shards_in_parts = True  # its shards asset keeps the published version's parts (text_store.py)

    def ingest(self, spec: PipelineSpec, files: list[Path], root: Path, out: Path, *, key: dict | None = None,
               hashes: dict[str, str] | None = None, published: PublishedCorpus | None = None) -> TextRawData:
        """The raw copy: by the new documents alone when the corpus is the ``published`` one grown
        (text_append.py), else every document read (text_ingest.py)."""
        return ingest_corpus(spec, files, root, out, key=key, hashes=hashes, published=published)

    def shard(self, spec: PipelineSpec, raw_file: Path, out_dir: Path, *, salt: str = "",
              previous: dict | None = None, tokenizer_file: Path | None = None) -> dict:
        return TextSharder(spec, raw_file, out_dir, salt=salt, previous=previous, tokenizer_file=tokenizer_file).run()

    def check_shards(self, spec: PipelineSpec, manifest: dict, out_dir: Path) -> QualityReport:
        return check_text_shards(spec, manifest, out_dir)


TEXT = TextKind()


class TextSharder:
    """One ``shard`` call: the documents' parts, the tokenizer, then each new part's shards.

    ``salt``: the data key's parameters and code (assets/pipeline.py ``part_salt``); ``previous``:
    the published version's manifest, whose parts with the same key are kept (their shard entries
    carried over, marked ``CARRIED``; nothing of them is tokenized or written); ``tokenizer_file``:
    a BPE tokenizer to use instead of training one (the published version's, text_store.py)."""

    def __init__(self, spec: PipelineSpec, raw_file: Path, out_dir: Path, *, salt: str = "",
                 previous: dict | None = None, tokenizer_file: Path | None = None):
        self.spec, self.raw, self.out_dir = spec, pq.ParquetFile(raw_file), out_dir
        self.prep = spec.preprocessing or TextPreprocessing()
        self.classes = class_names_of(spec)
        self.function = user_function(self.prep)
        self.fractions = (spec.split.train, spec.split.validation, spec.split.test)
        self.salt, self.previous, self.tokenizer_file = salt, previous, tokenizer_file
        self.labelled = "label" in self.raw.schema_arrow.names

    def run(self) -> dict:
        planned, tokenizer = self.plan()
        kept = previous_parts(self.previous)
        made = self.write_parts(planned.parts, set(kept), tokenizer)
        return text_manifest(planned, {**kept, **made})

    def plan(self) -> tuple[TextPlan, object]:
        """The documents' parts, their counts per split and the tokenizer (a BPE one trained, or
        the given file copied, into ``out_dir``): everything but the tokens. The shards asset's
        plan step (assets/text_shard_steps.py) is this; its groups are ``write_parts``."""
        members, codes = self._members()
        documents = _documents_per_split(codes)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tokenizer, files, tokenizer_info = self._tokenizer(codes)
        parts = plan_text_parts(members, self.prep.part_documents, self.salt, tokenizer_identity(tokenizer_info))
        return TextPlan(self.header(tokenizer_info), parts, documents, files), tokenizer

    def header(self, tokenizer_info: dict) -> dict:
        """The manifest but its splits, files and parts: what the spec and the tokenizer decide."""
        dtype, columns, per_shard = self._layout(tokenizer_info["vocab_size"])
        header = {
            "format": FORMAT_V2, "kind": "text", "task": self.spec.task, "columns": [c.to_dict() for c in columns],
            "preprocessing": preprocessing_record(self.prep, self.function),
            "tokenizer": tokenizer_info, "token_dtype": dtype, "samples_per_shard": per_shard,
            "order": PARTS_ORDER, "part_documents": self.prep.part_documents,
            "split": {"seed": self.spec.split.seed, "fractions": dict(zip(SPLITS, self.fractions)),
                      "by": "document id"},
        }
        if self.spec.task != "language_modeling":
            header.update(class_names=list(self.classes), num_classes=len(self.classes))
        return header

    def _layout(self, vocab_size: int):
        """(token dtype, shard columns, samples per shard) for a vocabulary of ``vocab_size``."""
        dtype = token_dtype(vocab_size)
        seq_len = self.prep.seq_len
        lm = self.spec.task == "language_modeling"
        columns = lm_columns(seq_len, dtype) if lm else classification_columns(seq_len, dtype)
        return dtype, columns, self.spec.split.shard_samples(sum(c.sample_bytes for c in columns) + ID_BYTES_ESTIMATE)

    def write_parts(self, parts: list[TextPart], kept: set[str], tokenizer) -> dict[str, tuple[dict, dict]]:
        """Tokenize and shard the ``parts`` whose key is not ``kept`` into ``out_dir``; {key:
        (record, shard entries per split)}. Only the raw copy's row groups that hold their
        documents are read."""
        dtype, columns, per_shard = self._layout(tokenizer.vocab_size)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self._write_parts(parts, kept, lambda name, split: _SplitWriter(
            self, tokenizer, ShardBuffer(self.out_dir, split, columns, per_shard, stem=name), dtype))

    def _row_groups(self, columns: list[str]) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
        """Each row group of the raw copy as a frame of ``columns``, with each row's split code."""
        for i in range(self.raw.num_row_groups):
            frame = self.raw.read_row_group(i, columns=columns).to_pandas()
            yield frame, assign_splits(frame["id"], self.spec.split.seed, self.fractions)

    def _members(self) -> tuple[list[tuple[str, str, str | None]], np.ndarray]:
        """Every document's (id, sha256 of its text, label) in raw-copy order, and its split code."""
        members, codes = [], []
        # a raw copy that holds each text's sha256 is read for its ids and hashes alone (by ranged
        # reads from the store in text_shard_steps.py: a small share of the copy); a copy written
        # before that column has its texts hashed here
        hashed = TEXT_SHA256 in self.raw.schema_arrow.names
        columns = ["id", TEXT_SHA256 if hashed else "text"] + (["label"] if self.labelled else [])
        for frame, split_codes in self._row_groups(columns):
            labels = frame["label"].tolist() if self.labelled else [None] * len(frame)
            digests = ([d.hex() for d in frame[TEXT_SHA256].tolist()] if hashed
                       else [hashlib.sha256(t.encode()).hexdigest() for t in frame["text"].tolist()])
            members += list(zip(frame["id"].tolist(), digests, labels))
            codes.append(split_codes)
        return members, (np.concatenate(codes) if codes else np.zeros(0, dtype=np.int8))

    def _tokenizer(self, codes: np.ndarray):
        """(tokenizer, files written beside the shards, the manifest's ``tokenizer``)."""
        if self.prep.tokenizer == "byte":
            tokenizer = ByteTokenizer()
            return tokenizer, [], tokenizer.describe()
        if self.tokenizer_file is not None:  # kept: its bytes beside the shards again, the same sha256
            tokenizer = BpeTokenizer.load(self.tokenizer_file)
            data = self.tokenizer_file.read_bytes()
            (self.out_dir / TOKENIZER_FILE).write_bytes(data)
            return tokenizer, [TOKENIZER_FILE], {**tokenizer.describe(), "sha256": hashlib.sha256(data).hexdigest()}
        train_texts = (t for frame in self._texts(codes == 0) for t in frame["text"])
        tokenizer = BpeTokenizer.train(train_texts, self.prep.vocab_size)
        digest = tokenizer.save(self.out_dir / TOKENIZER_FILE)
        return tokenizer, [TOKENIZER_FILE], {**tokenizer.describe(), "sha256": digest}

    def _texts(self, wanted: np.ndarray) -> Iterator[pd.DataFrame]:
        """The documents where ``wanted`` (a mask over the raw copy) holds, a row group at a time,
        after the user's function, with their positions in the raw copy (``at``)."""
        offset = 0
        columns = ["id", "text", "label"] if self.labelled else ["id", "text"]
        for i in range(self.raw.num_row_groups):
            n = self.raw.metadata.row_group(i).num_rows
            mask = wanted[offset:offset + n]
            if mask.any():
                frame = self.raw.read_row_group(i, columns=columns).to_pandas()[mask].assign(
                    at=np.flatnonzero(mask) + offset)
                ids = frame["id"].tolist()
                yield frame.assign(text=apply_function(self.function, frame["text"].tolist(), ids, self.prep.function))
            offset += n

    def _write_parts(self, plan: list[TextPart], kept: set[str], writer) -> dict:
        """Tokenize and shard the parts of ``plan`` whose key is not ``kept``, each split of each
        part on its own (``writer(name, split)``); {key: (record, shard entries per split)}. A
        document's split is its id's (``assign_splits``), so a step that reads only some row
        groups splits them as the whole corpus would."""
        new = [p for p in plan if p.key not in kept]
        wanted = np.zeros(self.raw.metadata.num_rows, dtype=bool)
        for part in new:
            wanted[part.start:part.stop] = True
        made: dict[str, tuple[dict, dict]] = {}
        pending = iter(new)
        part, open_ = None, None
        for frame in self._texts(wanted):
            at = frame["at"].to_numpy()
            while len(at):
                if part is None or at[0] >= part.stop:
                    if open_ is not None:
                        made[part.key] = _finish(part, open_)
                    part = next(pending)  # every new part holds a wanted document: the next one starts here
                    open_ = {split: writer(part.name, split) for split in SPLITS}
                inside = at < part.stop
                piece, frame, at = frame[inside], frame[~inside], at[~inside]
                piece_codes = assign_splits(piece["id"], self.spec.split.seed, self.fractions)
                for code, split in enumerate(SPLITS):
                    mine = piece[piece_codes == code]
                    if len(mine):
                        open_[split].add(mine)
        if open_ is not None:
            made[part.key] = _finish(part, open_)
        return made


PARTS_ORDER = ("documents in raw-copy order (files by path, lines in file order), in content-defined parts; "
               "a language-modelling window never spans two parts")


@dataclass(frozen=True)
class TextPart:
    key: str  # sha256 of the salt, the tokenizer's identity and the members: what decides reuse
    name: str  # of the members alone: the same documents get the same file names
    start: int  # its first document's position in the raw copy
    stop: int  # one past its last
    first_id: str
    last_id: str


@dataclass(frozen=True)
class TextPlan:
    """What ``TextSharder.plan`` decides before any token is written."""

    header: dict  # the manifest but its splits, files and parts
    parts: list[TextPart]  # in raw-copy order
    documents: dict[str, int]  # per split
    files: list[str]  # written beside the shards (the BPE tokenizer)


def text_manifest(plan: TextPlan, by_key: dict[str, tuple[dict, dict]]) -> dict:
    """The version's manifest from its ``plan`` and every part's (record, shard entries per split)
    by key, whether this build wrote it or kept it: the one assembly of a single-step build and of
    the shards asset's publish step, so the two give the same bytes."""
    records, entries = [], {s: [] for s in SPLITS}
    for part in plan.parts:
        try:
            record, part_entries = by_key[part.key]
        except KeyError:
            raise RuntimeError(f"part {part.name} (documents {part.first_id} .. {part.last_id}) was sharded by no "
                               "step and is not in the published version; re-execute the whole run") from None
        records.append(record)
        for split in SPLITS:
            entries[split] += part_entries[split]
    splits = {split: _split_totals([r["splits"][split] for r in records], entries[split]) for split in SPLITS}
    for split in SPLITS:
        splits[split]["num_documents"] = plan.documents[split]
    return {**plan.header, "splits": splits, "files": list(plan.files), "parts": records}


def part_to_dict(part: TextPart) -> dict:
    return {"key": part.key, "name": part.name, "start": part.start, "stop": part.stop,
            "first_id": part.first_id, "last_id": part.last_id}


def part_from_dict(d: dict) -> TextPart:
    return TextPart(d["key"], d["name"], d["start"], d["stop"], d["first_id"], d["last_id"])


def tokenizer_of(info: dict, file: Path | None):
    """The tokenizer the manifest's ``tokenizer`` record names; a BPE one loaded from ``file``."""
    if info["kind"] == "byte":
        return ByteTokenizer()
    if file is None:
        raise ValueError("a BPE tokenizer needs its tokenizer.json; none was given")
    return BpeTokenizer.load(file)


def tokenizer_identity(info: dict) -> str:
    """What a part's key says of the tokenizer: the BPE file's sha256, or "byte"."""
    return info.get("sha256") or info["kind"]


def plan_text_parts(members: list[tuple[str, str, str | None]], target: int, salt: str,
                    tokenizer: str) -> list[TextPart]:
    """The parts of the documents ``members`` (id, text sha256, label), in raw-copy order, cut by
    the image folders' rule (content-defined over the ids). A build on the previous version cuts
    exactly as one from nothing does, and keeps the parts whose keys it finds there, so the two
    give the same manifest."""
    parts, start = [], 0
    salted = f"{salt}\0tokenizer:{tokenizer}"
    for stop in cut_points([m[0] for m in members], target):
        held = members[start:stop]
        parts.append(TextPart(part_key(salted, held), part_key("", held)[:KEY_CHARS], start, stop,
                              held[0][0], held[-1][0]))
        start = stop
    return parts


def previous_parts(previous: dict | None) -> dict[str, tuple[dict, dict]]:
    """The parts of the manifest a version builds on, by key: (record, shard entries per split,
    each marked ``CARRIED``). A manifest made before parts has none to keep."""
    if not previous or previous.get("kind") != "text" or not previous.get("parts"):
        return {}
    by_path = {e["path"]: e for info in previous["splits"].values() for e in info["shards"]}
    out = {}
    for record in previous["parts"]:
        try:
            entries = {s: [{**by_path[path], CARRIED: True} for path in record["splits"][s]["shards"]]
                       for s in SPLITS}
        except KeyError as exc:
            raise ValueError(f"the published manifest lists shard {exc} in part {record['name']} but not in its "
                             "splits; re-materialise the shards with refit_tokenizer or another part_documents") from exc
        out[record["key"]] = (record, entries)
    return out


def _documents_per_split(codes: np.ndarray) -> dict[str, int]:
    counts = np.bincount(codes, minlength=len(SPLITS)) if len(codes) else np.zeros(len(SPLITS), dtype=np.int64)
    total = int(counts.sum())
    for code, split in enumerate(SPLITS):
        if counts[code] == 0:
            raise ValueError(f"the {split} split is empty ({total} documents in all): add documents or change "
                             "the split fractions")
    return {split: int(counts[code]) for code, split in enumerate(SPLITS)}


_SUMMED = ("num_samples", "num_tokens", "stream_tokens", "dropped_tokens", "truncated_documents",
           "truncated_tokens")


def _split_totals(records: list[dict], shards: list[dict]) -> dict:
    """A split of the manifest: its parts' figures summed, and their shard entries in part order."""
    present = [k for k in _SUMMED if records and k in records[0]]
    return {**{k: sum(r[k] for r in records) for k in present}, "shards": shards}


def _finish(part: TextPart, writers: dict) -> tuple[dict, dict]:
    splits, entries = {}, {}
    for split, writer in writers.items():
        splits[split], entries[split] = writer.finish()
    record = {"key": part.key, "name": part.name, "first_id": part.first_id, "last_id": part.last_id,
              "documents": part.stop - part.start, "splits": splits}
    return record, entries


class _SplitWriter:
    """One split of one part: its documents tokenized, packed (language modelling: a stream of
    its own, whose last partial window is dropped) or cut and padded, and written to its shards;
    it keeps what the shard checks of a later version need without reading them back."""

    def __init__(self, sharder: TextSharder, tokenizer, buffer: ShardBuffer, dtype: str):
        self.tokenizer, self.buffer, self.dtype = tokenizer, buffer, dtype
        self.lm = sharder.spec.task == "language_modeling"
        self.seq_len = sharder.prep.seq_len
        self.label_index = {name: i for i, name in enumerate(sharder.classes)}
        self.packer = WindowPacker(self.seq_len + 1, tokenizer.eos_id, dtype) if self.lm else None
        self.documents = self.kept = self.cut = self.truncated = 0
        self.max_token, self.labels = 0, []

    def add(self, frame: pd.DataFrame) -> None:
        tokens = self.tokenizer.encode_batch(frame["text"].tolist())
        ids = frame["id"].tolist()
        self.documents += len(ids)
        if self.lm:
            samples = self.packer.add(tokens, ids)
        else:
            self.kept += sum(min(len(t), self.seq_len) for t in tokens)
            self.cut += sum(max(len(t) - self.seq_len, 0) for t in tokens)
            self.truncated += sum(len(t) > self.seq_len for t in tokens)
            labels = [self.label_index[v] for v in frame["label"]]
            self.labels += labels
            samples = classification_samples(tokens, labels, ids, self.seq_len, self.tokenizer.pad_id, self.dtype)
        if len(samples["tokens"]):
            self.max_token = max(self.max_token, int(samples["tokens"].max()))
        self.buffer.add(samples)

    def finish(self) -> tuple[dict, list[dict]]:
        shards = self.buffer.finish()
        samples = sum(e["num_samples"] for e in shards)
        record = {"num_documents": self.documents, "num_samples": samples, "max_token": self.max_token,
                  "shards": [e["path"] for e in shards]}
        if self.lm:
            width = self.seq_len + 1
            record.update(num_tokens=samples * width, stream_tokens=self.packer.stream_tokens,
                          dropped_tokens=self.packer.dropped_tokens)
        else:
            record.update(num_tokens=self.kept, truncated_documents=self.truncated, truncated_tokens=self.cut,
                          min_label=min(self.labels, default=0), max_label=max(self.labels, default=0))
        return record, shards
