"""Analytic per-instance models of the prefill role, the decode role and the KV link.

Prefill (a batching queue). A busy prefill instance takes what waits (up to max_num_tokens) into
its next batch, so its batch size grows with load and its cost per token falls. The mean batch
T solves T = clamp(lambda x L_mean x prefill_s(T), L_mean, max_num_tokens); at that batch each request
costs L x prefill_s(T) / T of work. The router sends each prompt to the instance with the fewest
queued prompt tokens, so c instances queue like one G/G/c on that work (Allen-Cunneen's mean wait:
Erlang C's probability of waiting, the exponential tail for the percentile; c = 1 is Kingman's G/G/1),
not like c separate queues, which waited 3-7x longer than the simulator at 13-17 instances.
TTFT_p = wait_p + its own batch (at least its prompt) + the bucket timeout. Unstable when
lambda x L_mean x prefill_s(max) / max >= 1 per instance.

Decode (continuous batching, M/G/inf until the batch cap). Sequences in decode follow Little's law:
B = lambda x G_mean x TPOT with G = output_tokens - 1 steps, and TPOT = step_s(B) at the time-averaged
context L_in_mean + E[G^2] / (2 G_mean); the fixed point is found by iteration. The number of
sequences is Poisson(B), so the p-quantile batch is B + z_p sqrt(B), which must stay under
max_batch_size (else sequences queue for admission), and TPOT_p ~ step_s(that batch).

KV link (one FIFO per decode instance). Transfer = latency + bytes / bandwidth; an M/G/1 queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtpd.perf.kv_link import kv_transfer_s
from trtpd.perf.model import InstancePerf
from trtpd.planner import queueing
from trtpd.sim.lengths import LengthStats


@dataclass(frozen=True)
class WorkloadStats:
    input: LengthStats
    output: LengthStats
    arrival_cv2: float = 1.0

    @property
    def mean_tokens_per_request(self) -> float:
        return self.input.mean + self.output.mean


class PrefillModel:
    def __init__(self, inst: InstancePerf, stats: WorkloadStats, max_num_tokens: int,
                 bucket_timeout_s: float, min_batch_size: int) -> None:
        self.inst, self.stats = inst, stats
        self.max_num_tokens = max_num_tokens
        self.bucket_wait_s = bucket_timeout_s if min_batch_size > 1 else 0.0
        self.len_mean = stats.input.mean
        self.len_cv2 = max(0.0, stats.input.mean_sq / stats.input.mean ** 2 - 1)
        self.sq_per_token = stats.input.mean_sq / stats.input.mean   # E[L^2] / E[L]: sum L^2 per batched token

    def batch_s(self, num_tokens: float) -> float:
        return self.inst.perf.prefill_s(int(round(num_tokens)), int(round(num_tokens * self.sq_per_token)))

    def capacity_per_s(self) -> float:
        """Requests/s one instance sustains at full batches (utilization 1)."""
        t = self.max_num_tokens
        return t / self.batch_s(t) / self.len_mean

    def mean_batch_tokens(self, rate_per_s: float) -> float:
        t = self.len_mean
        for _ in range(50):
            nxt = min(self.max_num_tokens, max(self.len_mean, rate_per_s * self.len_mean * self.batch_s(t)))
            if abs(nxt - t) < 1e-3 * t:
                return nxt
            t = nxt
        return t

    def ttft_parts_s(self, rate_per_s: float, p: float, num_instances: int = 1) -> tuple[float, float]:
        """(queue wait at quantile p, own batch + bucket wait) for a request of the p-quantile length, at
        rate_per_s per instance. num_instances: the instances one router feeds. It sends each prompt to the
        one with the fewest queued prompt tokens, so they wait as in one queue with that many servers
        (G/G/c), not as in that many queues of one server: a prompt waits only when all are busy."""
        t = self.mean_batch_tokens(rate_per_s)
        per_token_s = self.batch_s(t) / t
        mean_service = self.len_mean * per_token_s
        if rate_per_s * mean_service >= 1:
            return math.inf, math.inf
        mean_wait, prob_wait = queueing.ggc_mean_wait_s(rate_per_s, mean_service, self.stats.arrival_cv2,
                                                        self.len_cv2, num_instances)
        wait_p = queueing.wait_quantile_s(mean_wait, prob_wait, p)
        len_p = self.stats.input.quantile(p)
        own = self.batch_s(min(self.max_num_tokens, max(len_p, t)))
        return wait_p, own + self.bucket_wait_s


class DecodeModel:
    def __init__(self, inst: InstancePerf, stats: WorkloadStats, max_batch_size: int) -> None:
        self.inst, self.stats = inst, stats
        self.max_batch_size = max_batch_size
        out = stats.output
        self.steps_mean = max(out.mean - 1, 1e-9)
        steps_sq = out.mean_sq - 2 * out.mean + 1          # E[(L_out - 1)^2]
        self.context_mean = stats.input.mean + steps_sq / (2 * self.steps_mean)

    def step_s(self, batch: float) -> float:
        batch = max(batch, 1.0)
        return self.inst.perf.decode_step_s(batch, batch * self.context_mean)

    def mean_batch(self, rate_per_s: float) -> tuple[float, float]:
        """(sequences in decode, TPOT) at the Little's-law fixed point; inf when it exceeds the cap."""
        tpot = self.step_s(1.0)
        batch = 1.0
        for _ in range(100):
            batch = rate_per_s * self.steps_mean * tpot
            if batch > self.max_batch_size:
                return math.inf, math.inf
            nxt = self.step_s(batch)
            if abs(nxt - tpot) < 1e-6 * tpot:
                return batch, nxt
            tpot = nxt
        return batch, tpot

    def tail(self, rate_per_s: float, p: float) -> tuple[float, float]:
        """(p-quantile batch, TPOT at that batch)."""
        batch, _ = self.mean_batch(rate_per_s)
        if math.isinf(batch):
            return math.inf, math.inf
        batch_p = queueing.poisson_quantile(batch, p)
        return batch_p, self.step_s(batch_p)


def max_batch_for_tpot(inst: InstancePerf, context_mean: float, tpot_s: float, kv_batch_limit: int) -> int:
    """Seed 004 3.3: the largest batch whose step time meets the TPOT target (0 if none), within KV."""
    lo, hi = 0, max(0, kv_batch_limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if inst.perf.decode_step_s(mid, mid * context_mean) <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


class KvLinkModel:
    def __init__(self, bytes_per_s: float, latency_s: float, kv_bytes_per_token: int, stats: WorkloadStats) -> None:
        self.bytes_per_s, self.latency_s = bytes_per_s, latency_s
        self.kv_bytes_per_token = kv_bytes_per_token
        self.stats = stats

    def transfer_s(self, num_tokens: float) -> float:
        return kv_transfer_s(num_tokens * self.kv_bytes_per_token, self.bytes_per_s, self.latency_s)

    def required_bytes_per_s(self, rate_per_s: float) -> float:
        """Seed 000 5.3, corrected: rate x input tokens x KV bytes per token (share of time 1)."""
        return rate_per_s * self.stats.input.mean * self.kv_bytes_per_token

    def transfer_p_s(self, rate_per_s: float, p: float) -> float:
        mean_s = self.transfer_s(self.stats.input.mean)
        per_token = self.kv_bytes_per_token / self.bytes_per_s
        second = (self.latency_s ** 2 + 2 * self.latency_s * per_token * self.stats.input.mean
                  + per_token ** 2 * self.stats.input.mean_sq)
        rho = rate_per_s * mean_s
        if rho >= 1:
            return math.inf
        wait_p = queueing.wait_quantile_s(queueing.mg1_mean_wait_s(rate_per_s, mean_s, second), rho, p)
        return wait_p + self.transfer_s(self.stats.input.quantile(p))
