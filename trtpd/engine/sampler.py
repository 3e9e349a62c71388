"""Greedy and seeded sampling, one row at a time so the result never depends on the batch.

Seeded sampling draws from a generator keyed by (seed, position): the same request gives the same
tokens wherever its steps run, on a colocated instance or split across prefill and decode.
A temperature below GREEDY_BELOW is greedy (as in vLLM): dividing by it would overflow the logits and
turn the softmax into NaN. `banned` tokens (bad words, end_id before min_length) get no probability.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5
SEED_MAX = 2**64 - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0      # 0 (or below GREEDY_BELOW): greedy
    top_k: int = 0                # 0: off
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for problem in sampling_problems(self.temperature, self.top_k, self.top_p, self.seed):
            raise ValueError(problem)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1


def sampling_problems(temperature: float, top_k: int, top_p: float, seed: int,
                      names: tuple[str, str, str, str] = ("temperature", "runtime_top_k", "runtime_top_p", "seed"),
                      vocab_size: int | None = None) -> list[str]:
    """What is wrong with these sampling parameters, each problem naming its field (empty: all fine)."""
    problems = []
    if not (math.isfinite(temperature) and temperature >= 0):
        problems.append(f"{names[0]} must be a finite number >= 0, got {temperature}")
    if top_k < 0 or (vocab_size is not None and top_k > vocab_size):
        limit = "" if vocab_size is None else f" and <= the vocabulary size {vocab_size}"
        problems.append(f"{names[1]} must be >= 0 (0: off){limit}, got {top_k}")
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        problems.append(f"{names[2]} must be in (0, 1], got {top_p}")
    if not 0 <= seed <= SEED_MAX:
        problems.append(f"{names[3]} must be an unsigned 64-bit integer (0 to 2^64-1), got {seed}")
    return problems


def sample(logits: torch.Tensor, params: SamplingParams, position: int, banned: Collection[int] = ()) -> int:
    """Samples the token at `position` from a [vocab] row of logits."""
    if banned:
        logits = logits.clone()
        logits[list(banned)] = float("-inf")
    if params.is_greedy:
        return int(torch.argmax(logits))
    scaled = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    gen = torch.Generator().manual_seed((params.seed * 1_000_003 + position) & 0x7FFF_FFFF_FFFF_FFFF)
    return int(torch.multinomial(probs, 1, generator=gen))
