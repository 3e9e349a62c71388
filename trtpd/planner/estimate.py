"""Joint analytic estimate of one configuration (TP and instance count per role) at a rate.

TTFT_p = prefill wait_p + its batch (+ bucket timeout); when the first token comes from the decode
instance (Triton's BLS path) also + one decode step (admission happens at step boundaries) + the
KV transfer (link queue + bytes / bandwidth). Adding per-stage quantiles over-estimates the
quantile of the sum, so the estimate is conservative; the simulator has the last word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trtpd.planner.candidates import DecodeCandidate, PrefillCandidate
from trtpd.planner.role_models import KvLinkModel

BISECT_STEPS = 40


@dataclass(frozen=True)
class Estimate:
    rate_per_s: float
    ttft_p_s: float
    tpot_p_s: float
    decode_batch_mean: float
    decode_batch_p: float
    prefill_utilization: float
    link_utilization: float
    binding: str | None        # None when both SLOs hold; else "ttft" / "tpot" / "decode_batch" / "kv_link"


@dataclass(frozen=True)
class Config:
    prefill: PrefillCandidate
    decode: DecodeCandidate
    link: KvLinkModel
    first_token_at_decode: bool
    ttft_correction: float = 1.0   # simulated / analytic TTFT_p at the verified point (Dynamo-style)
    tpot_correction: float = 1.0

    def decode_side_ttft_s(self, decode_rate_per_s: float, p: float) -> float:
        if not self.first_token_at_decode:
            return 0.0
        batch, _ = self.decode.model.mean_batch(decode_rate_per_s)
        if math.isinf(batch):
            return math.inf
        return self.decode.model.step_s(batch) + self.link.transfer_p_s(decode_rate_per_s, p)

    def estimate(self, num_prefill: int, num_decode: int, rate_per_s: float, ttft_slo_s: float,
                 tpot_slo_s: float, p: float) -> Estimate:
        rate_p, rate_d = rate_per_s / num_prefill, rate_per_s / num_decode
        dm = self.decode.model
        batch, _ = dm.mean_batch(rate_d)
        batch_p, tpot_p = dm.tail(rate_d, p)
        link_rho = rate_d * self.link.transfer_s(self.link.stats.input.mean)
        wait_p, own = self.prefill.model.ttft_parts_s(rate_p, p, num_prefill)
        ttft = (wait_p + own + self.decode_side_ttft_s(rate_d, p)) * self.ttft_correction
        tpot_p *= self.tpot_correction
        pm = self.prefill.model
        t = pm.mean_batch_tokens(rate_p)
        util = rate_p * pm.len_mean * pm.batch_s(t) / t
        binding = None
        if link_rho >= 1:
            binding = "kv_link"
        elif batch_p > dm.max_batch_size or math.isinf(batch):
            binding = "decode_batch"
        elif tpot_p > tpot_slo_s:
            binding = "tpot"
        elif ttft > ttft_slo_s:
            binding = "ttft"
        return Estimate(rate_per_s, ttft, tpot_p, batch, batch_p, util, link_rho, binding)

    def is_stable(self, num_prefill: int, num_decode: int, rate_per_s: float) -> bool:
        """Hard capacity, independent of the SLOs: every queue drains (prefill utilization < 1 at
        full batches, the decode fixed point under the batch cap, link utilization < 1). A short
        simulation of an unstable configuration can still look fine; this check cannot be fooled."""
        rate_p, rate_d = rate_per_s / num_prefill, rate_per_s / num_decode
        batch, _ = self.decode.model.mean_batch(rate_d)
        return (rate_p < self.prefill.model.capacity_per_s() and not math.isinf(batch)
                and rate_d * self.link.transfer_s(self.link.stats.input.mean) < 1)

    def corrected(self, ttft_correction: float, tpot_correction: float) -> "Config":
        return replace(self, ttft_correction=ttft_correction, tpot_correction=tpot_correction)

    # -- per-instance capacities ---------------------------------------------------------------------
    def decode_rate_max(self, tpot_slo_s: float, p: float) -> float:
        """Highest rate per decode instance with TPOT_p and the p-quantile batch within limits."""
        dm = self.decode.model

        def ok(rate: float) -> bool:
            batch_p, tpot_p = dm.tail(rate, p)
            return batch_p <= dm.max_batch_size and tpot_p <= tpot_slo_s and \
                rate * self.link.transfer_s(self.link.stats.input.mean) < 1
        hi = dm.max_batch_size / (dm.steps_mean * dm.step_s(1.0))
        return bisect_max(ok, hi)

    def prefill_rate_max(self, ttft_budget_s: float, p: float, num_prefill: int = 1) -> float:
        """Highest rate per prefill instance whose wait_p + own batch fits in ttft_budget_s, with num_prefill
        instances behind one router."""
        pm = self.prefill.model

        def ok(rate: float) -> bool:
            wait_p, own = pm.ttft_parts_s(rate, p, num_prefill)
            return wait_p + own <= ttft_budget_s
        return bisect_max(ok, pm.capacity_per_s())


def bisect_max(ok, hi: float) -> float:
    """Largest x in (0, hi) with ok(x), assuming ok is monotone (true then false); 0 if none."""
    lo = 0.0
    if not ok(hi * 1e-6):
        return 0.0
    if ok(hi):
        return hi
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
