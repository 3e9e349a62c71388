"""Checks a plan in the simulator and corrects the instance counts the analytic model got wrong.

The simulator is the arbiter. 1) Simulate the analytic counts at the target rate. 2) Scale the
analytic TTFT_p and TPOT_p by what the simulator measured (Dynamo-style correction factors) and
solve the counts again with the corrected model. 3) Local search: a passing configuration tries one
instance fewer per role; a failing one gets one more instance of the role that misses (TTFT misses
caused by waiting for decode admission count against decode). Keep the passing configuration with
the fewest GPUs. At most `max_simulations` runs, each on the same requests. A trimmed configuration's
simulation stops as soon as its failure is certain (trtpd.sim.attainment): only its pass or fail is used.

Three guards against short simulations that look better than the steady state (decode batches
take about the longest output x TPOT to fill): requests arriving in the first `warmup_s` are
not measured, nor those arriving in the last `warmup_s` (they live on into the drain after the last
arrival, when nothing new competes), and no configuration the analytic model finds unstable (a queue
that grows without bound) is tried, whatever a finite simulation says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from trtpd.percentiles import quantile
from trtpd.planner.candidates import DecodeCandidate, PrefillCandidate
from trtpd.planner.inputs import Slo
from trtpd.planner.role_models import KvLinkModel
from trtpd.sched.continuous import BatchSchedulerConfig
from trtpd.sim.cluster import BatchRole, ClusterSpec, KvLinkSpec, PrefillRole
from trtpd.sim.attainment import AttainmentWatch
from trtpd.sim.metrics import SimSummary, latencies, summarize
from trtpd.sim.simulator import SimRun, Simulator, default_max_in_system
from trtpd.sim.workload import RequestArrays

Counts = tuple[int, int]
# (simulated TTFT_p / analytic, simulated TPOT_p / analytic) at the first counts -> counts from the corrected model
Propose = Callable[[Counts, float, float], Counts | None]


def cluster_for(prefill: PrefillCandidate, decode: DecodeCandidate, num_prefill: int, num_decode: int,
                link: KvLinkModel, tokens_per_block: int, first_token_at: str) -> ClusterSpec:
    return ClusterSpec(
        mode="disaggregated",
        prefill=PrefillRole(num_prefill, prefill.inst.perf, prefill.inst.kv_capacity_tokens, prefill.scheduler),
        decode=BatchRole(num_decode, decode.inst.perf, decode.inst.kv_capacity_tokens,
                         BatchSchedulerConfig(max_batch_size=decode.max_batch_size,
                                              max_num_tokens=max(decode.max_batch_size, 1))),
        kv_link=KvLinkSpec(link.bytes_per_s, link.latency_s, link.kv_bytes_per_token),
        tokens_per_block=tokens_per_block, first_token_at=first_token_at,  # type: ignore[arg-type]
        # the serving path as measured with the decode role's curves (CPU profiles; none on GPUs)
        response_latency_s=decode.inst.response_latency_s, shared_cores=decode.inst.shared_cores)


@dataclass(frozen=True)
class Trial:
    counts: Counts
    summary: SimSummary | None    # None: stopped once it was certain to fail (its figures are not used)
    attainment: float             # stopped early: the share of the requests decided by then that met the SLO
    passed: bool
    ttft_q_s: float           # simulated TTFT and TPOT at the SLO's percentile
    tpot_q_s: float
    ttft_miss: float          # share of requests over the TTFT target
    tpot_miss: float
    run: SimRun | None = None     # the whole run (None when stopped early)


@dataclass(frozen=True)
class VerifyOutcome:
    num_prefill: int
    num_decode: int
    summary: SimSummary
    passed: bool
    ttft_q_s: float
    tpot_q_s: float
    num_simulations: int
    history: tuple[tuple[int, int, float], ...]    # (prefill, decode, attainment) per simulation (Trial's)
    run: SimRun | None = None                      # the chosen counts' whole run


def _trial(counts: Counts, run: SimRun, slo: Slo, warmup_s: float) -> Trial:
    summary = summarize(run, slo.ttft_s, slo.tpot_s, warmup_s=warmup_s, cooldown_s=warmup_s)
    lat = latencies(run, warmup_s=warmup_s, cooldown_s=warmup_s)
    ttft = np.where(np.isnan(lat.ttft_s), np.inf, lat.ttft_s)
    tpot = lat.tpot_s[~np.isnan(lat.tpot_s)]
    attainment = summary.slo_attainment or 0.0
    return Trial(counts, summary, attainment, attainment >= slo.attainment,
                 quantile(ttft, slo.attainment), quantile(tpot, slo.attainment) if len(tpot) else 0.0,
                 float(np.mean(ttft > slo.ttft_s)), float(np.mean(tpot > slo.tpot_s)) if len(tpot) else 0.0, run)


def verify(prefill: PrefillCandidate, decode: DecodeCandidate, counts: Counts, link: KvLinkModel,
           requests: RequestArrays, slo: Slo, tokens_per_block: int, first_token_at: str,
           analytic_q: Callable[[Counts], tuple[float, float]], propose: Propose | None = None,
           is_stable: Callable[[Counts], bool] = lambda c: True, max_gpus: int | None = None,
           try_fewer: bool = True, max_simulations: int = 5, warmup_s: float = 0.0,
           decide_early: bool = True) -> VerifyOutcome:
    """decide_early: a trimmed configuration's simulation stops once its failure is certain."""
    trials: dict[Counts, Trial] = {}
    order: list[Counts] = []

    def gpus(c: Counts) -> int:
        return c[0] * prefill.tp + c[1] * decode.tp

    def run(c: Counts, early: bool = False) -> Trial:
        """early: only pass or fail is needed, unless it passes."""
        if c not in trials:
            cluster = cluster_for(prefill, decode, c[0], c[1], link, tokens_per_block, first_token_at)
            sim = Simulator(cluster, requests, max_in_system=default_max_in_system(cluster))
            watch = AttainmentWatch(sim.records, slo.ttft_s, slo.tpot_s, slo.attainment, warmup_s=warmup_s,
                                    response_latency_s=cluster.response_latency_s, cooldown_s=warmup_s) \
                if early else None
            if watch is not None and not sim.run_until_decided(watch) and watch.passed is False:
                met, missed = watch.num_met, watch.num_missed
                trials[c] = Trial(c, None, met / (met + missed), False, math.inf, math.inf, 1.0, 1.0)
            else:
                trials[c] = _trial(c, sim.run(), slo, warmup_s)
            order.append(c)
        return trials[c]

    def allowed(c: Counts) -> bool:
        return min(c) >= 1 and (max_gpus is None or gpus(c) <= max_gpus) and c not in trials and is_stable(c)

    first = run(counts)
    candidate = counts
    if propose is not None:
        ttft_a, tpot_a = analytic_q(counts)
        ttft_c = first.ttft_q_s / ttft_a if ttft_a > 0 and np.isfinite(first.ttft_q_s) else 1.0
        tpot_c = first.tpot_q_s / tpot_a if tpot_a > 0 and first.tpot_q_s > 0 else 1.0
        proposed = propose(counts, ttft_c, tpot_c)
        if proposed is not None and allowed(proposed):
            candidate = proposed
    t = run(candidate)
    while not t.passed and len(trials) < max_simulations:        # reach a passing configuration
        b = t.summary.ttft_breakdown if t.summary is not None else None
        decode_side = b is not None and b.decode_queue_s > b.prefill_queue_s
        bump = (t.counts[0], t.counts[1] + 1) if (t.tpot_miss > t.ttft_miss or decode_side) \
            else (t.counts[0] + 1, t.counts[1])
        if not allowed(bump):
            break
        t = run(bump)
    if t.passed and try_fewer:                                    # then trim each role while it passes
        best = t.counts
        for role in (0, 1):
            while len(trials) < max_simulations:
                smaller = (best[0] - 1, best[1]) if role == 0 else (best[0], best[1] - 1)
                if not allowed(smaller) or not run(smaller, decide_early).passed:
                    break
                best = smaller
    passing = [trials[c] for c in order if trials[c].passed]
    best = min(passing, key=lambda t: (gpus(t.counts), -t.attainment)) if passing else trials[order[-1]]
    history = tuple((c[0], c[1], trials[c].attainment) for c in order)
    assert best.summary is not None           # only a trimmed configuration that failed stops early
    return VerifyOutcome(best.counts[0], best.counts[1], best.summary, best.passed, best.ttft_q_s, best.tpot_q_s,
                   len(order), history, best.run)
