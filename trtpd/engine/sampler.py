"""Greedy and seeded sampling, one row at a time so the result never depends on the batch.

Seeded sampling draws from a generator keyed by (seed, position): the same request gives the same
tokens wherever its steps run, on a colocated instance or split across prefill and decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy
    top_k: int = 0                # 0: off
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"runtime_top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"runtime_top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def sample(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """Samples the token at `position` from a [vocab] row of logits."""
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
