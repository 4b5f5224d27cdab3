"""Text generation from a causal language model (``transformer_lm`` or any model that maps tokens
[N, L] to next-token logits [N, L, vocab]): one token at a time, sampled with a seeded generator
so the same seed gives the same text."""

from __future__ import annotations

import torch
from torch import nn


def generate(model: nn.Module, prompt: list[int], max_new_tokens: int, *, max_len: int,
             temperature: float = 1.0, top_k: int | None = None, seed: int = 0,
             eos_id: int | None = None) -> list[int]:
    """Continue ``prompt`` by up to ``max_new_tokens`` tokens and return only the new ones.

    Each step feeds the last ``max_len`` tokens (the model has no positions beyond its training
    length) and samples the next token from softmax(logits / temperature), restricted to the
    ``top_k`` most likely tokens when given; ``temperature`` 0 takes the most likely token.
    Generation stops after ``eos_id`` is produced; that token is the last one returned, so a
    caller can tell an ending from running out of ``max_new_tokens``. The model runs in eval mode
    without gradients and gets its training mode back afterwards.
    """
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("generate needs a non-empty prompt: the model predicts from at least one token "
                         "(start with the tokenizer's EOS id to generate from scratch)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1 (the model's sequence length), got {max_len}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens, new = list(prompt), []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                context = torch.tensor([tokens[-max_len:]], dtype=torch.long, device=device)
                logits = model(context)
                if logits.dim() != 3 or logits.shape[:2] != context.shape:
                    raise ValueError(f"generate needs a model that maps tokens [N, L] to logits [N, L, vocab]; "
                                     f"for input {list(context.shape)} it returned {list(logits.shape)}")
                next_token = _pick(logits[0, -1].float(), temperature, top_k, generator)
                tokens.append(next_token)
                new.append(next_token)
                if eos_id is not None and next_token == eos_id:
                    break
    finally:
        model.train(was_training)
    return new


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> int:
    """The next token from one position's logits [vocab]."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth_largest = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
