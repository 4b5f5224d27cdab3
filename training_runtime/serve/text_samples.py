"""A few continuations a language model writes, for its model version's metadata: prompts are the
openings of held-out windows, so a reader sees the model on text it never trained on."""

from __future__ import annotations

import numpy as np

from training_runtime.serve.card import LoadedModel

BYTE_VOCAB = 258  # bytes 0..255, then eos and pad (the byte tokenizer of the shards asset)


def decoder_for(loaded: LoadedModel):
    """ids -> text with the tokenizer the shards were made with (``tokenizer.json`` for BPE)."""
    tok = loaded.card.get("tokenizer") or {}
    if tok.get("kind") == "bpe":
        if loaded.tokenizer_json is None:
            raise FileNotFoundError("the model was trained on BPE tokens; put its tokenizer.json beside "
                                    "model_card.json to read them")
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(loaded.tokenizer_json)
        return lambda ids: tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
    if loaded.info.vocab_size == BYTE_VOCAB:
        return lambda ids: bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")
    raise ValueError(f"no decoder for tokenizer {tok!r} with vocabulary {loaded.info.vocab_size}")


def sample_continuations(loaded: LoadedModel, windows: np.ndarray, *,
                         prompt_tokens: int = 24, max_new_tokens: int = 40, temperature: float = 0.8,
                         top_k: int | None = 40, seed: int = 0) -> list[dict[str, str]]:
    """One continuation per row of ``windows`` (token windows of the test split)."""
    from training_runtime.serve.generate import generate

    decode = decoder_for(loaded)
    max_len = int(loaded.card["model"]["input_shape"][0])
    out = []
    for i, window in enumerate(windows):
        prompt = [int(t) for t in window[:prompt_tokens]]
        new = generate(loaded.model, prompt, max_new_tokens, max_len=max_len, temperature=temperature, top_k=top_k,
                       seed=seed + i, eos_id=loaded.info.eos_id)
        out.append({"prompt": decode(prompt), "continuation": decode(new)})
    return out
