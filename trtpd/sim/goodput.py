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


def attainment_at(cluster: ClusterSpec, workload: WorkloadSpec, rate_per_s: float, ttft_s: float, tpot_s: float,
                  num_requests: int, seed: int) -> float:
    run = simulate(cluster, generate_requests(workload, rate_per_s, num_requests, seed),
                   max_in_system=default_max_in_system(cluster))
    return summarize(run, ttft_s, tpot_s).slo_attainment or 0.0


def max_goodput_rate_per_s(cluster: ClusterSpec, workload: WorkloadSpec, ttft_s: float, tpot_s: float,
                           attainment: float, num_requests: int = 4000, seed: int = 0,
                           start_rate_per_s: float = 1.0, num_bisections: int = 8,
                           probe: Callable[..., float] = attainment_at,
                           give_up: Callable[[float], bool] | None = None) -> GoodputResult:
    """Doubles the rate until attainment falls below the target, then bisects (same seed throughout).

    give_up(hi): asked after each failing probe at rate hi; True stops the search there (the answer,
    whatever the remaining probes say, is below hi): a caller that only needs to know whether the
    goodput reaches some rate skips the probes that cannot change that."""
    probes: list[tuple[float, float]] = []

    def ok(rate: float) -> bool:
        a = probe(cluster, workload, rate, ttft_s, tpot_s, num_requests, seed)
        probes.append((rate, a))
        return a >= attainment

    lo, hi = 0.0, start_rate_per_s
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1e7:
            break
    else:
        if give_up is not None and give_up(hi):
            return GoodputResult(hi, 0.0, tuple(probes), gave_up=True)
    for _ in range(num_bisections):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
            if give_up is not None and give_up(hi):
                return GoodputResult(hi, 0.0, tuple(probes), gave_up=True)
    best = max((a for r, a in probes if r == lo), default=0.0)
    return GoodputResult(lo, best, tuple(probes))
