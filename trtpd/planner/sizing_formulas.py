"""Seed 000 section 5.3's sizing formulas, corrected where they are dimensionally wrong.

1. Prefill instances. Seed: peak QPS x mean input tokens x prefill time per token / instance throughput.
   [req/s x tokens/req x s/token] is already dimensionless (busy instances); dividing again by tokens/s
   gives s/token, and the seed's example (100 x 512 x 0.0005 / 2000 = 0.0128) is 2000x too small.
   Corrected: N = QPS x L_in / TP_prefill (= QPS x L_in x t_token when t_token = 1 / TP_prefill):
   100 x 512 / 2000 = 25.6 -> 26 instances.
2. Decode instances. Seed: concurrent sequences x time per token / concurrency per instance gives
   seconds. Corrected: N = concurrent sequences / sequences per instance, where by Little's law
   concurrent sequences = QPS x L_out x TPOT: 500 / 64 = 7.8 -> 8 instances.
3. KV-transfer bandwidth. Seed: concurrency x KV bytes per token x 2 / share of time gives bytes,
   not bytes/s, and leaves out the tokens per request. Corrected (per link):
   bandwidth = request rate x input tokens x KV bytes per token / share of time the link may be busy.
   Also: a GQA model's KV is far smaller than the seed's 2.5 MB/token (Llama-2-70B: 320 KiB in fp16,
   160 KiB in fp8; fp8 halves the bytes and hence the bandwidth).
"""

from __future__ import annotations

import math


def prefill_instances(peak_rate_per_s: float, input_tokens: float, prefill_tokens_per_s: float) -> float:
    """Busy prefill instances: request rate x tokens per request / tokens per second per instance."""
    return peak_rate_per_s * input_tokens / prefill_tokens_per_s


def concurrent_sequences(rate_per_s: float, output_tokens: float, tpot_s: float) -> float:
    """Little's law: sequences in decode = arrival rate x time in decode (L_out x TPOT)."""
    return rate_per_s * output_tokens * tpot_s


def decode_instances(num_concurrent_sequences: float, max_batch_size: int) -> float:
    return num_concurrent_sequences / max_batch_size


def kv_link_bandwidth_bytes_per_s(rate_per_s: float, input_tokens: float, kv_bytes_per_token: float,
                                  busy_share: float = 1.0) -> float:
    """Bytes/s one link must carry if its transfers may occupy only busy_share of the time."""
    if not 0 < busy_share <= 1:
        raise ValueError(f"busy_share must be in (0, 1], got {busy_share}")
    return rate_per_s * input_tokens * kv_bytes_per_token / busy_share


def round_up(instances: float) -> int:
    return max(1, math.ceil(instances - 1e-9))
