"""How text becomes tokens: the user's function, the byte and BPE tokenizers, and the hash of it
all that the manifest records (``code_sha256``), so that changed preprocessing makes new shards
and a new data version.

- ``byte``: a document's UTF-8 bytes as ids 0..255, then eos=256 and pad=257 (vocabulary 258);
  nothing to train, nothing to ship.
- ``bpe``: a byte-level BPE (``tokenizers``: ByteLevel pre-tokenizer and decoder, every byte in
  the initial alphabet, so any text encodes without an unknown token) trained on the training
  split only, with eos and pad as its first two ids. It is saved as ``tokenizer.json`` beside
  the shards. Training is deterministic: the same texts in the same order give the same file.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from core.spec import TextPreprocessing

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
BYTE_EOS, BYTE_PAD = 256, 257
BYTE_VOCAB = 258
TOKENIZER_FILE = "tokenizer.json"
BPE_MIN_FREQUENCY = 2  # a merge must be seen twice: one-off strings do not take vocabulary slots
UINT16_VOCAB = 1 << 16


def token_dtype(vocab_size: int) -> str:
    """uint16 while every id fits (both tokenizers up to 65,536 ids): half the bytes of int32 per
    token, and reading tokens is what bounds a language model's loader; int32 beyond."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "int32"


class ByteTokenizer:
    kind = "byte"
    vocab_size = BYTE_VOCAB
    eos_id, pad_id = BYTE_EOS, BYTE_PAD

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def describe(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "pad_id": self.pad_id}


class BpeTokenizer:
    kind = "bpe"

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        # Text that spells a special token ("<|endoftext|>" in a document about tokenizers) is
        # text: only the packer puts eos between documents.
        self._tokenizer.encode_special_tokens = True
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = tokenizer.token_to_id(EOS_TOKEN)
        self.pad_id = tokenizer.token_to_id(PAD_TOKEN)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BpeTokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=BPE_MIN_FREQUENCY,
                                      special_tokens=[EOS_TOKEN, PAD_TOKEN], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: Path) -> "BpeTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        dtype = token_dtype(self.vocab_size)
        return [np.asarray(e.ids, dtype=dtype) for e in self._tokenizer.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: Path) -> str:
        """Write tokenizer.json; return its sha256."""
        data = self._tokenizer.to_str().encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    def describe(self) -> dict:
        from importlib.metadata import version

        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "pad_id": self.pad_id,
                "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, "path": TOKENIZER_FILE,
                "special_token_text": "encoded as ordinary text", "library": f"tokenizers {version('tokenizers')}"}


def user_function(prep: TextPreprocessing) -> Callable[[str], str] | None:
    """The ``"package.module:function"`` of ``prep``, imported; None when there is none."""
    if prep.function is None:
        return None
    module_name, _, attr = prep.function.partition(":")
    try:
        target = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"preprocessing.function {prep.function!r} cannot be imported: {exc}") from exc
    if not callable(target):
        raise ValueError(f"preprocessing.function {prep.function!r} is a {type(target).__name__}, not a function")
    return target


def apply_function(function: Callable[[str], str] | None, texts: list[str], ids: list[str],
                   name: str | None) -> list[str]:
    if function is None:
        return texts
    out = []
    for text, doc_id in zip(texts, ids):
        result = function(text)
        if not isinstance(result, str):
            raise ValueError(f"preprocessing.function {name!r} returned a {type(result).__name__} for document "
                             f"{doc_id!r}; it must return the document's new text (a str)")
        out.append(result)
    return out


def preprocessing_record(prep: TextPreprocessing, function: Callable[[str], str] | None) -> dict:
    """The manifest's ``preprocessing``: the parameters and a hash of them with the code that turns
    text into tokens (this module) and the user's function (its source)."""
    params = {"kind": "text", "tokenizer": prep.tokenizer, "seq_len": prep.seq_len, "function": prep.function,
              "vocab_size": prep.vocab_size if prep.tokenizer == "bpe" else BYTE_VOCAB}
    code = {"builtin": inspect.getsource(sys.modules[__name__]), "function": _function_source(prep, function)}
    digest = hashlib.sha256(json.dumps({"params": params, "code": code}, sort_keys=True).encode()).hexdigest()
    return {**params, "code_sha256": digest}


def _function_source(prep: TextPreprocessing, function: Callable[[str], str] | None) -> str | None:
    if function is None:
        return None
    try:
        return inspect.getsource(function)
    except (OSError, TypeError) as exc:
        raise ValueError(f"preprocessing.function {prep.function!r}: its source code cannot be read ({exc}); the "
                         "data version hashes it, so use a function defined in a Python file") from exc
