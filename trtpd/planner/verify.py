"""Checks a plan in the simulator and corrects the instance counts the analytic model got wrong.

The simulator is the arbiter: if the simulated SLO attainment falls short, add an instance to the
role that misses (TTFT misses caused by waiting for decode admission count against decode); if it
passes, try one instance fewer per role and keep the cut when the simulator still passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtpd.planner.candidates import DecodeCandidate, PrefillCandidate
from trtpd.planner.inputs import Slo
from trtpd.planner.role_models import KvLinkModel
from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sim.cluster import BatchRole, ClusterSpec, KvLinkSpec, PrefillRole
from trtpd.sim.metrics import SimSummary, latencies, summarize
from trtpd.sim.simulator import simulate
from trtpd.sim.workload import RequestArrays

MAX_ADJUSTMENTS = 6


def cluster_for(prefill: PrefillCandidate, decode: DecodeCandidate, num_prefill: int, num_decode: int,
                link: KvLinkModel, tokens_per_block: int, first_token_at: str) -> ClusterSpec:
    return ClusterSpec(
        mode="disaggregated",
        prefill=PrefillRole(num_prefill, prefill.inst.perf, prefill.inst.kv_capacity_tokens, prefill.scheduler),
        decode=BatchRole(num_decode, decode.inst.perf, decode.inst.kv_capacity_tokens,
                         BatchSchedulerConfig(max_batch_size=decode.max_batch_size,
                                              max_num_tokens=max(decode.max_batch_size, 1))),
        kv_link=KvLinkSpec(link.bytes_per_s, link.latency_s, link.kv_bytes_per_token),
        tokens_per_block=tokens_per_block, first_token_at=first_token_at)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Verdict:
    num_prefill: int
    num_decode: int
    summary: SimSummary
    passed: bool
    ttft_q_s: float           # simulated TTFT and TPOT at the SLO's percentile
    tpot_q_s: float
    num_simulations: int
    history: tuple[tuple[int, int, float], ...]    # (prefill, decode, attainment) per simulation


def _misses(requests_ttft: np.ndarray, requests_tpot: np.ndarray, slo: Slo) -> tuple[float, float]:
    ttft_miss = float(np.mean(~(requests_ttft <= slo.ttft_s)))
    tpot_miss = float(np.mean(requests_tpot > slo.tpot_s))
    return ttft_miss, tpot_miss


def verify(prefill: PrefillCandidate, decode: DecodeCandidate, num_prefill: int, num_decode: int,
           link: KvLinkModel, requests: RequestArrays, slo: Slo, tokens_per_block: int, first_token_at: str,
           max_gpus: int | None = None, try_fewer: bool = True) -> Verdict:
    history: list[tuple[int, int, float]] = []
    last: dict = {}

    def run(n_p: int, n_d: int):
        cluster = cluster_for(prefill, decode, n_p, n_d, link, tokens_per_block, first_token_at)
        result = simulate(cluster, requests)
        summary = summarize(result, slo.ttft_s, slo.tpot_s)
        history.append((n_p, n_d, summary.slo_attainment or 0.0))
        last[(n_p, n_d)] = result
        return result, summary

    def gpus(n_p: int, n_d: int) -> int:
        return n_p * prefill.tp + n_d * decode.tp

    n_p, n_d = num_prefill, num_decode
    result, summary = run(n_p, n_d)
    passed = (summary.slo_attainment or 0.0) >= slo.attainment
    for _ in range(MAX_ADJUSTMENTS):
        if passed:
            break
        lat = latencies(result)
        ttft_miss, tpot_miss = _misses(lat.ttft_s, lat.tpot_s, slo)
        b = summary.ttft_breakdown
        decode_side = b is not None and b.decode_queue_s > b.prefill_queue_s
        if tpot_miss > ttft_miss or decode_side:
            n_d += 1
        else:
            n_p += 1
        if max_gpus is not None and gpus(n_p, n_d) > max_gpus:
            break
        result, summary = run(n_p, n_d)
        passed = (summary.slo_attainment or 0.0) >= slo.attainment
    if passed and try_fewer:
        for role in ("prefill", "decode"):
            while True:
                c_p, c_d = (n_p - 1, n_d) if role == "prefill" else (n_p, n_d - 1)
                if min(c_p, c_d) < 1:
                    break
                _, s = run(c_p, c_d)
                if (s.slo_attainment or 0.0) < slo.attainment:
                    break
                n_p, n_d, summary = c_p, c_d, s
    ttft_q, tpot_q = _quantiles(last[(n_p, n_d)], slo.attainment)
    return Verdict(n_p, n_d, summary, passed, ttft_q, tpot_q, len(history), tuple(history))


def _quantiles(result, p: float) -> tuple[float, float]:
    lat = latencies(result)
    ttft = np.where(np.isnan(lat.ttft_s), np.inf, lat.ttft_s)
    tpot = lat.tpot_s[~np.isnan(lat.tpot_s)]
    return float(np.quantile(ttft, p)), float(np.quantile(tpot, p)) if len(tpot) else 0.0
