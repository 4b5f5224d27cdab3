"""Token samples and the shard files that hold them.

Language modelling packs a token stream (documents in order, an eos between two documents) into
windows of ``seq_len + 1`` tokens, inputs and their shifted targets in one, with no padding: every
token lands in exactly one window, except the stream's last tokens that fill no whole window, which
are dropped and counted. The shards asset packs each split of each part of a corpus as a stream of
its own (assets/kinds/text.py), so fewer than one window is dropped per part and split. Classification keeps one sample per document,
its tokens cut or padded to ``seq_len``.

Memory stays bounded: the packer holds the tokens of one batch of documents plus less than one
window carried over; the shard buffer writes a shard as soon as it holds one shard's samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from training_runtime.data.shard_format import Column, ShardWriter


def lm_columns(seq_len: int, dtype: str) -> list[Column]:
    return [Column("tokens", "ndarray", role="input", dtype=dtype, shape=(seq_len + 1,)),
            Column("id", "str", role="id")]


def classification_columns(seq_len: int, dtype: str) -> list[Column]:
    return [Column("tokens", "ndarray", role="input", dtype=dtype, shape=(seq_len,)),
            Column("length", "ndarray", role="input", dtype="int32", shape=()),
            Column("label", "ndarray", role="target", dtype="int64", shape=()),
            Column("id", "str", role="id")]


class WindowPacker:
    """Cuts one split's token stream into full windows; ``add`` returns the windows completed."""

    def __init__(self, width: int, eos: int, dtype: str):
        self.width, self.eos, self.dtype = width, eos, np.dtype(dtype)
        self.carry = np.zeros(0, dtype=self.dtype)  # fewer than ``width`` tokens, waiting for more
        self.carry_owners: list[tuple[int, str]] = []  # (offset in carry, document id) where each part starts
        self.documents = 0
        self.stream_tokens = 0

    def add(self, tokens: Sequence[np.ndarray], ids: Sequence[str]) -> dict[str, object]:
        """Append documents (their tokens, their ids) to the stream; the eos before a document
        belongs to it, so a window that starts on one names the document that follows."""
        parts = [self.carry]
        starts = [offset for offset, _ in self.carry_owners]
        owners = [doc_id for _, doc_id in self.carry_owners]
        position = len(self.carry)
        for doc_tokens, doc_id in zip(tokens, ids):
            part = np.asarray(doc_tokens).astype(self.dtype, copy=False)
            if self.documents:  # between two documents, not before the first
                part = np.concatenate([np.array([self.eos], dtype=self.dtype), part])
            parts.append(part)
            starts.append(position)
            owners.append(doc_id)
            position += len(part)
            self.stream_tokens += len(part)
            self.documents += 1
        stream = np.concatenate(parts)
        n = len(stream) // self.width
        cut = n * self.width
        first_part = np.searchsorted(np.asarray(starts, dtype=np.int64), np.arange(n) * self.width, side="right") - 1
        windows = stream[:cut].reshape(n, self.width)
        ends = [*starts[1:], len(stream)]
        self.carry = stream[cut:].copy()
        self.carry_owners = [(max(s - cut, 0), o) for s, o, end in zip(starts, owners, ends) if end > cut]
        return {"tokens": windows, "id": [owners[i] for i in first_part]}

    @property
    def dropped_tokens(self) -> int:
        """Tokens at the end of the stream that fill no whole window."""
        return len(self.carry)


def classification_samples(tokens: Sequence[np.ndarray], labels: Sequence[int], ids: Sequence[str],
                           seq_len: int, pad: int, dtype: str) -> dict[str, object]:
    """One sample per document: its first ``seq_len`` tokens, padded with ``pad`` after them."""
    rows = np.full((len(tokens), seq_len), pad, dtype=dtype)
    lengths = np.zeros(len(tokens), dtype=np.int32)
    for i, doc in enumerate(tokens):
        kept = doc[:seq_len]
        rows[i, :len(kept)] = kept
        lengths[i] = len(kept)
    return {"tokens": rows, "length": lengths, "label": np.asarray(labels, dtype=np.int64), "id": list(ids)}


class ShardBuffer:
    """Collects one split's samples and writes a shard file (``<split>/<n>.bin``, or
    ``<split>/<stem>-<n>.bin`` for one part of a corpus) each time it holds ``per_shard`` of them;
    ``finish`` writes the rest."""

    def __init__(self, out_dir: Path, split: str, columns: Sequence[Column], per_shard: int, stem: str = ""):
        self.out_dir, self.split, self.columns, self.per_shard = out_dir, split, list(columns), per_shard
        self.stem = stem
        self.writer = ShardWriter(self.columns)
        self.parts: list[dict[str, object]] = []
        self.held = 0
        self.entries: list[dict] = []

    def add(self, samples: dict[str, object]) -> None:
        n = len(samples["id"])
        if not n:
            return
        self.parts.append(samples)
        self.held += n
        while self.held >= self.per_shard:
            self._write(self.per_shard)

    def finish(self) -> list[dict]:
        if self.held:
            self._write(self.held)
        return self.entries

    def _write(self, count: int) -> None:
        joined = {c.name: _join([p[c.name] for p in self.parts], c) for c in self.columns}
        shard = {name: values[:count] for name, values in joined.items()}
        # A copy, so that the joined batch is freed once this shard is written.
        rest = {name: values[count:].copy() for name, values in joined.items()}
        rel = f"{self.split}/{self.stem + '-' if self.stem else ''}{len(self.entries):05d}.bin"
        self.entries.append(self.writer.write(self.out_dir / rel, rel, shard))
        self.held -= count
        self.parts = [rest] if self.held else []


def _join(values: list, column: Column):
    if column.kind == "ndarray":
        return np.concatenate(values) if len(values) > 1 else values[0]
    return [v for part in values for v in part]
