"""Text corpora as a ``DataKind``: JSONL and .txt documents -> a Parquet raw copy -> token shards.

- ``ingest`` reads the files ``docs_per_chunk`` documents at a time (text_read.py), refuses what
  cannot be used, naming file, line and problem, and writes the accepted documents row group by
  row group to ``documents.parquet``: ``id`` ("<file>:<line>" or "<file>"), ``text``, ``label``
  (classification only) and ``chars``.
- ``shard`` splits documents by a seeded hash of their id (before any tokenizing: the BPE sees
  the training split only), applies the user's function, tokenizes (text_tokens.py) and writes
  format-v2 shards (text_pack.py), streaming the raw copy one row group at a time and one split
  at a time, so memory holds one row group and at most one shard's samples.
- ``check_shards``: text_shard_checks.py.

Documents keep the raw copy's order (files by path, lines in file order) in every split, so the
same corpus gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from assets.kinds.base import RawData
from assets.kinds.text_pack import (
    ShardBuffer,
    WindowPacker,
    classification_columns,
    classification_samples,
    lm_columns,
)
from assets.kinds.text_quality import DocumentExpectations, class_names_of, document_problem
from assets.kinds.text_read import Document, Problems, read_documents, relative_name
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
from assets.sharding import SPLITS, assign_splits
from assets.source import file_sha256
from core.spec import PipelineSpec, TextPreprocessing
from training_runtime.data.shard_format import FORMAT_V2

RAW_NAME = "documents.parquet"
ID_BYTES_ESTIMATE = 32  # a document id's typical UTF-8 size, for sizing shards in bytes


class TextKind:
    raw_name = RAW_NAME

    def ingest(self, spec: PipelineSpec, files: list[Path], root: Path, out: Path) -> RawData:
        problems = Problems()
        expectations = DocumentExpectations(spec)
        per_file: dict[str, int] = {}
        rows = 0
        with RawCopyWriter(out, labelled=bool(class_names_of(spec))) as writer:
            documents = read_documents(spec.source, files, root, problems, per_file)
            for chunk in _chunks(documents, spec.source.docs_per_chunk):
                expectations.add(chunk)
                kept = _acceptable(spec, chunk, problems)
                writer.write(kept)
                rows += len(kept)
        if expectations.documents == 0:
            problems.add(f"the corpus holds no documents ({len(files)} file(s) read: {_first_names(files, root)})")
        report = QualityReport(f"{spec.name}/raw_dataset", expectations.finish(len(files)), problems.listed())
        return RawData(path=out, rows=rows, report=report, sources=_describe(files, root, per_file))

    def shard(self, spec: PipelineSpec, raw_file: Path, out_dir: Path) -> dict:
        return TextSharder(spec, raw_file, out_dir).run()

    def check_shards(self, spec: PipelineSpec, manifest: dict, out_dir: Path) -> QualityReport:
        return check_text_shards(spec, manifest, out_dir)


TEXT = TextKind()


def _chunks(documents: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while chunk := list(islice(documents, size)):
        yield chunk


def _acceptable(spec: PipelineSpec, chunk: list[Document], problems: Problems) -> list[Document]:
    """The documents of ``chunk`` whose length and label are right; the others' problems recorded."""
    kept = []
    for document in chunk:
        problem = document_problem(spec, document)
        if problem:
            problems.add(problem)
        else:
            kept.append(document)
    return kept


def _first_names(files: list[Path], root: Path) -> str:
    names = sorted(relative_name(f, root) for f in files)
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _describe(files: list[Path], root: Path, per_file: dict[str, int]) -> list[dict]:
    """What raw_dataset records about each file read (a symbolic link as the link, not followed)."""
    out = []
    for f in sorted(files, key=lambda p: relative_name(p, root)):
        rel = relative_name(f, root)
        entry = {"file": rel, "bytes": f.lstat().st_size, "documents": per_file.get(rel, 0)}
        if f.is_symlink():
            entry["link"] = str(f.readlink())
        elif f.is_file():
            entry["sha256"] = file_sha256(f)
        out.append(entry)
    return out


class RawCopyWriter:
    """documents.parquet, one row group per chunk of accepted documents."""

    def __init__(self, path: Path, labelled: bool):
        fields = [("id", pa.string()), ("text", pa.large_string())]
        fields += [("label", pa.string())] if labelled else []
        self.schema = pa.schema([*fields, ("chars", pa.int64())])
        self.labelled = labelled
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")

    def write(self, documents: list[Document]) -> None:
        if not documents:
            return
        columns = {"id": [d.id for d in documents], "text": [d.text for d in documents]}
        if self.labelled:
            columns["label"] = [d.label for d in documents]
        columns["chars"] = [len(d.text) for d in documents]
        self._writer.write_table(pa.Table.from_pydict(columns, schema=self.schema), row_group_size=len(documents))

    def __enter__(self) -> "RawCopyWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._writer.close()


class TextSharder:
    """One ``shard`` call: counts, the tokenizer, then each split's shards in turn."""

    def __init__(self, spec: PipelineSpec, raw_file: Path, out_dir: Path):
        self.spec, self.raw, self.out_dir = spec, pq.ParquetFile(raw_file), out_dir
        self.prep = spec.preprocessing or TextPreprocessing()
        self.classes = class_names_of(spec)
        self.function = user_function(self.prep)
        self.fractions = (spec.split.train, spec.split.validation, spec.split.test)

    def run(self) -> dict:
        documents = self._documents_per_split()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tokenizer, files, tokenizer_info = self._tokenizer()
        dtype = token_dtype(tokenizer.vocab_size)
        lm = self.spec.task == "language_modeling"
        seq_len = self.prep.seq_len
        columns = lm_columns(seq_len, dtype) if lm else classification_columns(seq_len, dtype)
        per_shard = self.spec.split.shard_samples(sum(c.sample_bytes for c in columns) + ID_BYTES_ESTIMATE)
        splits = {split: self._write_split(code, split, tokenizer, columns, per_shard, dtype)
                  for code, split in enumerate(SPLITS)}
        for split in SPLITS:
            splits[split]["num_documents"] = documents[split]
        manifest = {
            "format": FORMAT_V2, "kind": "text", "task": self.spec.task, "columns": [c.to_dict() for c in columns],
            "preprocessing": preprocessing_record(self.prep, self.function),
            "tokenizer": tokenizer_info, "token_dtype": dtype, "samples_per_shard": per_shard,
            "order": "documents in raw-copy order (files by path, lines in file order)",
            "split": {"seed": self.spec.split.seed, "fractions": dict(zip(SPLITS, self.fractions)),
                      "by": "document id"},
            "splits": splits, "files": files,
        }
        if not lm:
            manifest.update(class_names=list(self.classes), num_classes=len(self.classes))
        return manifest

    def _row_groups(self, columns: list[str]) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
        """Each row group of the raw copy as a frame of ``columns``, with each row's split code."""
        for i in range(self.raw.num_row_groups):
            frame = self.raw.read_row_group(i, columns=columns).to_pandas()
            yield frame, assign_splits(frame["id"], self.spec.split.seed, self.fractions)

    def _documents_per_split(self) -> dict[str, int]:
        counts = np.zeros(len(SPLITS), dtype=np.int64)
        for _, codes in self._row_groups(["id"]):
            counts += np.bincount(codes, minlength=len(SPLITS))
        total = int(counts.sum())
        for code, split in enumerate(SPLITS):
            if counts[code] == 0:
                raise ValueError(f"the {split} split is empty ({total} documents in all): add documents or change "
                                 "the split fractions")
        return {split: int(counts[code]) for code, split in enumerate(SPLITS)}

    def _texts(self, code: int, columns: list[str]) -> Iterator[pd.DataFrame]:
        """The documents of one split, a row group at a time, after the user's function."""
        for frame, codes in self._row_groups(columns):
            frame = frame[codes == code]
            if len(frame):
                ids = frame["id"].tolist()
                yield frame.assign(text=apply_function(self.function, frame["text"].tolist(), ids, self.prep.function))

    def _tokenizer(self):
        """(tokenizer, files written beside the shards, the manifest's ``tokenizer``)."""
        if self.prep.tokenizer == "byte":
            tokenizer = ByteTokenizer()
            return tokenizer, [], tokenizer.describe()
        train_texts = (t for frame in self._texts(0, ["id", "text"]) for t in frame["text"])
        tokenizer = BpeTokenizer.train(train_texts, self.prep.vocab_size)
        digest = tokenizer.save(self.out_dir / TOKENIZER_FILE)
        return tokenizer, [TOKENIZER_FILE], {**tokenizer.describe(), "sha256": digest}

    def _write_split(self, code: int, split: str, tokenizer, columns, per_shard: int, dtype: str) -> dict:
        buffer = ShardBuffer(self.out_dir, split, columns, per_shard)
        if self.spec.task == "language_modeling":
            return self._write_windows(code, buffer, tokenizer, dtype)
        return self._write_documents(code, buffer, tokenizer, dtype)

    def _write_windows(self, code: int, buffer: ShardBuffer, tokenizer, dtype: str) -> dict:
        width = self.prep.seq_len + 1
        packer = WindowPacker(width, tokenizer.eos_id, dtype)
        for frame in self._texts(code, ["id", "text"]):
            buffer.add(packer.add(tokenizer.encode_batch(frame["text"].tolist()), frame["id"].tolist()))
        shards = buffer.finish()
        windows = sum(e["num_samples"] for e in shards)
        return {"num_samples": windows, "num_tokens": windows * width, "stream_tokens": packer.stream_tokens,
                "dropped_tokens": packer.dropped_tokens, "shards": shards}

    def _write_documents(self, code: int, buffer: ShardBuffer, tokenizer, dtype: str) -> dict:
        seq_len = self.prep.seq_len
        label_index = {name: i for i, name in enumerate(self.classes)}
        kept = cut = truncated = 0
        for frame in self._texts(code, ["id", "text", "label"]):
            tokens = tokenizer.encode_batch(frame["text"].tolist())
            kept += sum(min(len(t), seq_len) for t in tokens)
            cut += sum(max(len(t) - seq_len, 0) for t in tokens)
            truncated += sum(len(t) > seq_len for t in tokens)
            buffer.add(classification_samples(tokens, [label_index[v] for v in frame["label"]], frame["id"].tolist(),
                                              seq_len, tokenizer.pad_id, dtype))
        shards = buffer.finish()
        return {"num_samples": sum(e["num_samples"] for e in shards), "num_tokens": kept,
                "truncated_documents": truncated, "truncated_tokens": cut, "shards": shards}
