"""DistServe's goodput: the highest request rate at which a share of requests meets both SLOs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.metrics import summarize
from trtpd.sim.simulator import default_max_in_system, simulate
from trtpd.sim.workload import WorkloadSpec, generate_requests


@dataclass(frozen=True)
class GoodputResult:
    rate_per_s: float
    attainment: float
    probes: tuple[tuple[float, float], ...]    # (rate, attainment) per simulation
    gave_up: bool = False      # stopped once `give_up(hi)` held: the goodput is below hi (rate_per_s: hi)


def settle_span_s(longest_output_tokens: float, tpot_s: float) -> float:
    """The longest output x TPOT: how long decode batches take to fill (the warm-up, not measured) and how
    long the last arrivals live on into the drain after them, when nothing new competes (the cool-down, not
    measured either: it flatters them)."""
    return longest_output_tokens * tpot_s


def num_requests_measuring(num_measured: int, rate_per_s: float, span_s: float) -> int:
    """A run that measures num_measured requests between a warm-up and a cool-down of span_s each."""
    return num_measured + int(2 * rate_per_s * span_s)


def attainment_at(cluster: ClusterSpec, workload: WorkloadSpec, rate_per_s: float, ttft_s: float, tpot_s: float,
                  num_requests: int, seed: int) -> float:
    """num_requests measured between a warm-up and a cool-down (settle_span_s), as the planner's probes."""
    span_s = settle_span_s(workload.output_stats().max, tpot_s)
    requests = generate_requests(workload, rate_per_s, num_requests_measuring(num_requests, rate_per_s, span_s), seed)
    run = simulate(cluster, requests, max_in_system=default_max_in_system(cluster))
    return summarize(run, ttft_s, tpot_s, warmup_s=span_s, cooldown_s=span_s).slo_attainment or 0.0


def max_goodput_rate_per_s(cluster: ClusterSpec, workload: WorkloadSpec, ttft_s: float, tpot_s: float,
                           attainment: float, num_requests: int = 4000, seed: int = 0,
                           start_rate_per_s: float = 1.0, num_bisections: int = 8,
                           probe: Callable[..., float] = attainment_at,
                           give_up: Callable[[float], bool] | None = None, growth: float = 2.0,
                           resolution: float | None = None) -> GoodputResult:
    """From start_rate_per_s, multiplies the rate by growth until attainment falls below the target (or,
    with growth < 2 and a failing start, divides it by growth, three times at most, then halves it, until it
    holds), then bisects (same seed throughout):
    num_bisections times, or, with resolution, until the bracket is within that share of its low end
    (at most num_bisections times).

    give_up(hi): asked after each failing probe at rate hi; True stops the search there (the answer,
    whatever the remaining probes say, is below hi): a caller that only needs to know whether the
    goodput reaches some rate skips the probes that cannot change that."""
    probes: list[tuple[float, float]] = []

    def ok(rate: float) -> bool:
        a = probe(cluster, workload, rate, ttft_s, tpot_s, num_requests, seed)
        probes.append((rate, a))
        return a >= attainment

    def gave_up(hi: float) -> bool:
        return give_up is not None and give_up(hi)

    lo, hi = 0.0, start_rate_per_s
    if growth < 2 and not ok(hi):             # a start near the answer: look below it, by growth, then halves
        if gave_up(hi):
            return GoodputResult(hi, 0.0, tuple(probes), gave_up=True)
        steps = 0
        while hi > 1e-3 * start_rate_per_s:
            below = hi / growth if steps < 3 else hi / 2
            steps += 1
            if ok(below):
                lo = below
                break
            hi = below
            if gave_up(hi):
                return GoodputResult(hi, 0.0, tuple(probes), gave_up=True)
    else:
        if growth < 2:
            lo, hi = hi, hi * growth
        while ok(hi):
            lo, hi = hi, hi * growth
            if hi > 1e7:
                break
        else:
            if gave_up(hi):
                return GoodputResult(hi, 0.0, tuple(probes), gave_up=True)
    for _ in range(num_bisections):
        if resolution is not None and hi - lo <= resolution * lo * (1 + 1e-9):    # (a step of exactly that)
            break
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
            if gave_up(hi):
                return GoodputResult(hi, 0.0, tuple(probes), gave_up=True)
    best = max((a for r, a in probes if r == lo), default=0.0)
    return GoodputResult(lo, best, tuple(probes))
