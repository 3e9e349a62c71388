"""Prompts with an exact token count, built from the deterministic synthetic corpus."""

from __future__ import annotations

from trtpd.engine import corpus


def prompt_with_tokens(tokenizer, num_tokens: int, seed: int) -> str:
    """Text that `tokenizer.encode` turns into exactly `num_tokens` ids (BOS included)."""
    if num_tokens < 2:
        raise ValueError(f"num_tokens must be >= 2 (BOS plus one token), got {num_tokens}")
    sentences = max(8, num_tokens // 4)
    ids = tokenizer.encode(corpus.text(sentences, seed=seed))
    while len(ids) < num_tokens + 8:
        sentences *= 2
        ids = tokenizer.encode(corpus.text(sentences, seed=seed))
    cut = num_tokens
    for _ in range(64):
        text = tokenizer.decode(ids[1:cut])
        n = len(tokenizer.encode(text))
        if n == num_tokens and text.strip():
            return text
        cut += 1 if n < num_tokens else -1
    raise RuntimeError(f"could not build a prompt of exactly {num_tokens} tokens (seed {seed})")
