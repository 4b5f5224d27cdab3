"""What a shard manifest says about the samples a model trains on, in one place for the trainer,
the tasks, the model card and serving: the input column and how it becomes a model input, the
target column, classes, vocabulary and normalisation.

Three kinds of data, in two shard formats (v1 read as v2, ``shard_format.as_v2``):

- ``table``: v1 manifests (float32 features, int64 class labels) and v2 manifests of kind
  ``table`` (float32 ``features``; an int64 ``label``, a float32 ``target`` for regression, or a
  float32 0/1 ``target`` vector for multi-label). Features were normalised when sharding.
- ``images``: v2 manifests of kind ``images``: uint8 (H, W, C) ``image`` pixels, or ``jpeg``
  bytes decoded to that shape by the loader. The model gets float (C, H, W), scaled by
  ``IMAGE_SCALE`` and normalised with ``IMAGE_MEAN`` / ``IMAGE_STD``.
- ``text``: v2 manifests of kind ``text``: ``tokens`` windows (language modelling: seq_len + 1
  tokens, the target is the window shifted by one) or padded documents with a ``label``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from training_runtime.data.shard_format import ShardFormatError, as_v2

# Images reach the model as (pixel / 255 - 0.5) / 0.25: centred, roughly unit variance, the same
# for every dataset so a card needs no statistics (recorded in the model card all the same).
IMAGE_SCALE = 1.0 / 255.0
IMAGE_MEAN = 0.5
IMAGE_STD = 0.25


class DataInfoError(ValueError):
    """A manifest the built-in tasks cannot train on; the message names what is missing."""


@dataclass(frozen=True)
class DataInfo:
    kind: str  # "table", "images" or "text"
    task: str  # what the manifest's targets are: classification, regression, multilabel, language_modeling
    input_column: str  # the batch column the model reads ("features", "image", "jpeg", "tokens")
    input_dtype: str  # of one sample as the loader yields it (after decoding)
    input_shape: tuple[int, ...]  # one sample as the loader yields it: (H, W, C) images, (L,) tokens
    encoded: bool  # the input column holds encoded bytes (JPEG) that the loader decodes
    target_column: str | None  # None: language modelling (targets come from the tokens)
    target_dtype: str | None
    target_shape: tuple[int, ...]  # () scalar targets, (k,) regression vectors or multi-label
    num_classes: int | None  # classification and multi-label (k labels)
    class_names: tuple[str, ...]  # class (or label) names, when the data has them
    vocab_size: int | None  # text
    pad_id: int | None
    eos_id: int | None
    normalisation: Mapping | None  # table features: {"mean", "std"}, in the shards or applied on read
    target_normalisation: Mapping | None  # regression: {"mean", "std"} of the training split's targets

    @classmethod
    def from_manifest(cls, manifest: Mapping) -> DataInfo:
        try:  # v1 manifests as the reader sees them: columns features and label (the shards do not matter here)
            manifest = as_v2({k: v for k, v in manifest.items() if k != "splits"})
        except ShardFormatError as e:
            raise DataInfoError(str(e)) from e
        columns = manifest.get("columns") or []
        inputs = [c for c in columns if c.get("role") == "input"]
        targets = [c for c in columns if c.get("role") == "target"]
        kind = manifest.get("kind", "table")
        # Text classification also stores each document's length; the model reads the tokens.
        main = next((c for c in inputs if c["name"] in ("tokens", "image", "jpeg", "features")), None)
        if main is None:
            raise DataInfoError(f"manifest columns {[c['name'] for c in columns]} have no input column the "
                                "built-in trainer reads ('features', 'image', 'jpeg' or 'tokens')")
        encoded = main["kind"] == "bytes"
        if encoded:
            shape, dtype = tuple(manifest["sample_shape"]), "uint8"
        else:
            shape, dtype = tuple(main.get("shape", ())), main["dtype"]
        target = targets[0] if targets else None
        tokenizer = manifest.get("tokenizer") or {}
        names = tuple(manifest.get("class_names") or manifest.get("target_names") or ())
        nc = manifest.get("num_classes")
        return cls(kind=kind, task=manifest.get("task", "classification"), input_column=main["name"],
                   input_dtype=dtype, input_shape=shape, encoded=encoded,
                   target_column=target["name"] if target else None,
                   target_dtype=target.get("dtype") if target else None,
                   target_shape=tuple(target.get("shape", ())) if target else (),
                   num_classes=int(nc) if nc is not None else None, class_names=names,
                   vocab_size=tokenizer.get("vocab_size"), pad_id=tokenizer.get("pad_id"),
                   eos_id=tokenizer.get("eos_id"), normalisation=manifest.get("normalisation"),
                   target_normalisation=manifest.get("target_normalisation"))

    def model_input_shape(self) -> list[int]:
        """The ``input_shape`` a model factory is given: images as [C, H, W], tokens as the
        sequence the model reads (a language model reads seq_len of its seq_len + 1 tokens)."""
        if self.kind == "images":
            h, w, c = self.input_shape
            return [c, h, w]
        if self.kind == "text" and self.task == "language_modeling":
            return [self.input_shape[0] - 1]
        return list(self.input_shape)

    def to_model_input(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of the input column as the model takes it (on x's device)."""
        if self.kind == "images":
            x = x.permute(0, 3, 1, 2).float().contiguous()  # NCHW in memory too (DDP buckets expect it)
            return (x * IMAGE_SCALE - IMAGE_MEAN) / IMAGE_STD
        if self.kind == "text":
            return x.long()
        return x.float()

    def describe_input(self) -> dict:
        """The input section of a model card."""
        out = {"kind": self.kind, "column": self.input_column, "dtype": self.input_dtype,
               "sample_shape": list(self.input_shape), "model_shape": self.model_input_shape()}
        if self.kind == "images":
            out["normalisation"] = {"scale": IMAGE_SCALE, "mean": IMAGE_MEAN, "std": IMAGE_STD,
                                    "layout": "NCHW float32 from NHWC uint8"}
        elif self.normalisation is not None:
            out["normalisation"] = dict(self.normalisation)
        if self.kind == "text":
            out.update(vocab_size=self.vocab_size, pad_id=self.pad_id, eos_id=self.eos_id)
        return out


def model_batch(info: DataInfo, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A loader batch (column name -> tensor) as the tasks take it: ``input`` ready for the model,
    ``target`` as stored (absent for language modelling, whose task shifts the tokens)."""
    out = {"input": info.to_model_input(batch[info.input_column])}
    if info.target_column is not None:
        out["target"] = batch[info.target_column]
    return out
