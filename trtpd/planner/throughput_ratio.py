"""Seed 004's capacity-planning method, reproduced exactly (first pass of the planner).

Symbols follow the seed: TP_* are throughputs in tokens/s (not tensor parallelism), L_in/L_out mean
input/output tokens per request, TP_total total tokens/s (input + output).

  3.1  N_prefill = TP_total x L_in  / ((L_in + L_out) x TP_prefill)
       N_decode  = TP_total x L_out / ((L_in + L_out) x TP_decode)
  3.2  M/M/1: mu = TP_prefill_max / L_in (requests/s); mean TTFT = 1 / (mu - lambda) + T_overhead, so the
       highest rate meeting a TTFT target gives TP_prefill = TP_prefill_max - L_in / (TTFT - T_overhead).
  3.3  TP_decode = batch_size / TPOT, at the largest batch whose measured TPOT meets the target.
  4.5  R_P/D = (L_in x TP_decode) / (L_out x TP_prefill).

The seed rounds N_prefill = 3.08 down to 3 at 5M tokens/min; instance counts here round up (a
fractional instance does not exist), and `max_tokens_per_min` states what a given P/D pair sustains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtpd.errors import ConfigError


def prefill_throughput_under_ttft(tp_prefill_max: float, input_tokens: float, ttft_s: float,
                                  overhead_s: float) -> float:
    """Seed 004 3.2: usable prefill tokens/s when mean TTFT (M/M/1 sojourn + overhead) must be <= ttft_s."""
    budget_s = ttft_s - overhead_s
    if budget_s <= 0:
        raise ConfigError(f"TTFT target {ttft_s} s leaves no time after the {overhead_s} s overhead")
    usable = tp_prefill_max - input_tokens / budget_s
    if usable <= 0:
        raise ConfigError(f"TTFT target {ttft_s} s is unreachable: one {input_tokens:.0f}-token prompt alone "
                          f"takes {input_tokens / tp_prefill_max:.3f} s at {tp_prefill_max:.0f} tokens/s")
    return usable


def mm1_mean_ttft_s(tp_prefill_max: float, input_tokens: float, rate_per_s: float, overhead_s: float) -> float:
    """Seed 004 3.2's TTFT equation: 1 / (mu - lambda) + T_overhead (the M/M/1 mean sojourn)."""
    mu = tp_prefill_max / input_tokens
    if rate_per_s >= mu:
        return math.inf
    return 1.0 / (mu - rate_per_s) + overhead_s


def decode_throughput(batch_size: int, tpot_s: float) -> float:
    """Seed 004 3.3: TP_decode = batch_size / TPOT (output tokens/s of one decode instance)."""
    if tpot_s <= 0:
        raise ConfigError(f"TPOT must be positive, got {tpot_s}")
    return batch_size / tpot_s


def pd_ratio(input_tokens: float, output_tokens: float, tp_prefill: float, tp_decode: float) -> float:
    """Seed 004 4.5: prefill instances per decode instance, (L_in x TP_decode) / (L_out x TP_prefill)."""
    return (input_tokens * tp_decode) / (output_tokens * tp_prefill)


def tokens_per_min_to_per_s(tokens_per_min: float) -> float:
    return tokens_per_min / 60.0


@dataclass(frozen=True)
class Seed004Plan:
    total_tokens_per_s: float
    prefill_instances_exact: float
    decode_instances_exact: float
    num_prefill: int
    num_decode: int
    max_tokens_per_min: float      # what num_prefill P + num_decode D sustain
    binding_role: str              # which role limits max_tokens_per_min
    seed_num_prefill: int          # the seed's own rounding (to nearest) ...
    seed_num_decode: int
    seed_max_tokens_per_min: float # ... and the highest rate that pair sustains
    seed_binding_role: str


def instance_counts(total_tokens_per_s: float, input_tokens: float, output_tokens: float,
                    tp_prefill: float, tp_decode: float) -> Seed004Plan:
    """Seed 004 3.1, with counts rounded up and the sustainable rate of the rounded pair."""
    share_in = input_tokens / (input_tokens + output_tokens)
    share_out = output_tokens / (input_tokens + output_tokens)
    n_p = total_tokens_per_s * share_in / tp_prefill
    n_d = total_tokens_per_s * share_out / tp_decode
    num_p, num_d = max(1, math.ceil(n_p - 1e-9)), max(1, math.ceil(n_d - 1e-9))
    max_tps, binding = max_total_tokens_per_s(num_p, num_d, input_tokens, output_tokens, tp_prefill, tp_decode)
    seed_p, seed_d = max(1, round(n_p)), max(1, round(n_d))
    seed_tps, seed_binding = max_total_tokens_per_s(seed_p, seed_d, input_tokens, output_tokens, tp_prefill, tp_decode)
    return Seed004Plan(total_tokens_per_s, n_p, n_d, num_p, num_d, max_tps * 60.0, binding,
                       seed_p, seed_d, seed_tps * 60.0, seed_binding)


def max_total_tokens_per_s(num_prefill: int, num_decode: int, input_tokens: float, output_tokens: float,
                           tp_prefill: float, tp_decode: float) -> tuple[float, str]:
    """The highest total tokens/s a P/D pair sustains, and the role that binds."""
    total = input_tokens + output_tokens
    by_prefill = num_prefill * tp_prefill * total / input_tokens
    by_decode = num_decode * tp_decode * total / output_tokens
    return (by_prefill, "prefill") if by_prefill <= by_decode else (by_decode, "decode")
