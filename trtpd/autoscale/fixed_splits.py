"""Fixed allocations under a budget: every (prefill, decode) split simulated, the best one picked.

The best split has the highest SLO attainment; ties go to fewer instance-seconds. What an autoscaler is
measured against: the same workload, the same budget, but one split for the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.metrics import SimSummary, summarize
from trtpd.sim.simulator import SimRun, default_max_in_system, simulate
from trtpd.sim.workload import RequestArrays


@dataclass(frozen=True)
class SplitResult:
    num_prefill: int
    num_decode: int
    summary: SimSummary           # all requests measured (no warm-up cut)
    instance_s: float
    stopped_overloaded: bool

    @property
    def attainment(self) -> float:
        return self.summary.slo_attainment or 0.0

    @property
    def label(self) -> str:
        return f"{self.num_prefill}P{self.num_decode}D"


def splits_within(budget: int, cost: dict[str, int], min_instances: dict[str, int],
                  max_instances: dict[str, int]) -> list[tuple[int, int]]:
    """Every (prefill, decode) count within the role limits whose cost fits in the budget."""
    out = []
    for num_p in range(min_instances["prefill"], max_instances["prefill"] + 1):
        for num_d in range(min_instances["decode"], max_instances["decode"] + 1):
            if num_p * cost["prefill"] + num_d * cost["decode"] <= budget:
                out.append((num_p, num_d))
    return out


def with_counts(cluster: ClusterSpec, num_prefill: int, num_decode: int) -> ClusterSpec:
    if cluster.mode != "disaggregated" or cluster.prefill is None or cluster.decode is None:
        raise ValueError("fixed splits are prefill/decode counts: the cluster must be disaggregated")
    return replace(cluster, prefill=replace(cluster.prefill, num_instances=num_prefill),
                   decode=replace(cluster.decode, num_instances=num_decode))


def measure(run: SimRun, num_prefill: int, num_decode: int, ttft_s: float, tpot_s: float) -> SplitResult:
    return SplitResult(num_prefill, num_decode, summarize(run, ttft_s, tpot_s, warmup_fraction=0.0),
                       run.instance_seconds(), run.stopped_overloaded)


def simulate_splits(cluster: ClusterSpec, requests: RequestArrays, splits: list[tuple[int, int]],
                    ttft_s: float, tpot_s: float) -> list[SplitResult]:
    """Each split simulated on the same requests (an overloaded one stops early: its rest are misses)."""
    results = []
    for num_p, num_d in splits:
        c = with_counts(cluster, num_p, num_d)
        run = simulate(c, requests, max_in_system=default_max_in_system(c))
        results.append(measure(run, num_p, num_d, ttft_s, tpot_s))
    return results


def search_splits(cluster: ClusterSpec, requests: RequestArrays, splits: list[tuple[int, int]],
                  ttft_s: float, tpot_s: float, exhaustive: bool = False) -> list[SplitResult]:
    """The splits simulated to find the best (best_split of the result is the best of all `splits`).

    Not exhaustive: first each prefill count with its most decode instances; then, for the prefill counts
    that reached the best attainment, fewer decode instances while they still reach it (a cheaper tie).
    Fewer instances of a role never raise attainment (up to simulation noise), so a skipped split can
    neither beat nor tie the best."""
    if exhaustive:
        return simulate_splits(cluster, requests, splits, ttft_s, tpot_s)
    by_prefill: dict[int, list[int]] = {}
    for num_p, num_d in splits:
        by_prefill.setdefault(num_p, []).append(num_d)
    most = [(num_p, max(ds)) for num_p, ds in sorted(by_prefill.items())]
    results = simulate_splits(cluster, requests, most, ttft_s, tpot_s)
    top = max(r.attainment for r in results) if results else 0.0
    for r in list(results):
        if r.attainment < top:
            continue
        for num_d in sorted((d for d in by_prefill[r.num_prefill] if d < r.num_decode), reverse=True):
            fewer = simulate_splits(cluster, requests, [(r.num_prefill, num_d)], ttft_s, tpot_s)[0]
            results.append(fewer)
            if fewer.attainment < top:
                break
    return results


def best_split(results: list[SplitResult]) -> SplitResult:
    """Highest attainment; ties: fewer instance-seconds, then fewer prefill instances."""
    if not results:
        raise ValueError("no split fits in the budget")
    return min(results, key=lambda r: (-r.attainment, r.instance_s, r.num_prefill))
