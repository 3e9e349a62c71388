"""The plan search: every TP pair, the fewest instances meeting the SLOs, DistServe's objective.

With a target rate: for each (prefill TP, decode TP), the decode count comes from the highest
per-instance rate meeting TPOT_p, the prefill count from the highest per-instance rate meeting
TTFT_p (after the decode side's share of TTFT); keep the pair with the fewest GPUs, and among
those the highest goodput per GPU (the highest rate the configuration sustains / its GPUs).
Without a target, or when the target needs more GPUs than the budget: the configuration within
the budget that sustains the highest rate. Infeasible targets name the binding constraint and
the nearest feasible value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trtpd.catalog import ModelSpec
from trtpd.perf.hardware import HardwareProfile
from trtpd.perf.kv_link import kv_link_bytes_per_s
from trtpd.planner.candidates import (DecodeCandidate, PrefillCandidate, Rejected, decode_candidate,
                                      prefill_candidate, round_up)
from trtpd.planner.estimate import Config, Estimate, bisect_max
from trtpd.planner.infeasible import infeasible_rate, no_candidates
from trtpd.planner.inputs import SearchSpace, Slo, Target
from trtpd.planner.role_models import KvLinkModel, WorkloadStats
from trtpd.sim.workload import WorkloadSpec

MAX_BUMPS = 8


@dataclass(frozen=True)
class PlanProblem:
    model: ModelSpec
    hardware: HardwareProfile
    workload: WorkloadSpec
    slo: Slo
    target: Target | None
    space: SearchSpace


@dataclass(frozen=True)
class Choice:
    config: Config
    num_prefill: int
    num_decode: int
    estimate: Estimate
    max_rate_per_s: float
    link_kind: str

    @property
    def num_gpus(self) -> int:
        return self.num_prefill * self.config.prefill.tp + self.num_decode * self.config.decode.tp

    @property
    def goodput_per_gpu_per_s(self) -> float:
        return self.max_rate_per_s / self.num_gpus


@dataclass
class SearchResult:
    stats: WorkloadStats
    max_input_len: int
    max_seq_len: int
    rate_per_s: float | None
    choice: Choice | None
    feasible: bool
    binding_constraint: str | None = None
    nearest_feasible: dict[str, float] = field(default_factory=dict)
    rejected: list[Rejected] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planner: "Planner | None" = None


def workload_stats(workload: WorkloadSpec) -> WorkloadStats:
    cv = workload.arrival_cv
    return WorkloadStats(workload.input_stats(), workload.output_stats(), cv * cv)


class Planner:
    def __init__(self, problem: PlanProblem) -> None:
        self.problem = problem
        p, space = problem, problem.space
        self.stats = workload_stats(p.workload)
        self.max_input_len = round_up(self.stats.input.max, space.tokens_per_block)
        self.max_seq_len = self.max_input_len + int(self.stats.output.max)
        self.p = p.slo.attainment
        self.rejected: list[Rejected] = []
        self.prefills: list[PrefillCandidate] = []
        self.decodes: list[DecodeCandidate] = []
        for tp in sorted(set(space.tp_prefill)):
            c = prefill_candidate(p.model, p.hardware, tp, self.stats, self.max_input_len, space)
            (self.rejected if isinstance(c, Rejected) else self.prefills).append(c)
        for tp in sorted(set(space.tp_decode)):
            c = decode_candidate(p.model, p.hardware, tp, self.stats, self.max_seq_len, p.slo, space)
            (self.rejected if isinstance(c, Rejected) else self.decodes).append(c)
        self._decode_rate: dict[tuple[int, int, str, float], float] = {}

    def target_rate_per_s(self) -> float | None:
        """The problem's target as requests/s (a tokens/min target through the workload's mean lengths)."""
        target = self.problem.target
        return target.requests_per_s(self.stats.mean_tokens_per_request) if target else None

    # -- configuration building blocks ----------------------------------------------------------------
    def link(self, tp_prefill: int, tp_decode: int, kind: str) -> KvLinkModel:
        bw = kv_link_bytes_per_s(self.problem.hardware, kind, tp_prefill, tp_decode)
        inst = self.prefills[0].inst if self.prefills else self.decodes[0].inst
        return KvLinkModel(bw, self.problem.space.kv_link_latency_s, inst.kv_bytes_per_token, self.stats)

    def config(self, cp: PrefillCandidate, cd: DecodeCandidate, kind: str) -> Config:
        return Config(cp, cd, self.link(cp.tp, cd.tp, kind), self.problem.space.first_token_at == "decode")

    def decode_rate_max(self, cfg: Config, kind: str) -> float:
        key = (cfg.prefill.tp, cfg.decode.tp, kind, cfg.tpot_correction)
        if key not in self._decode_rate:
            self._decode_rate[key] = cfg.decode_rate_max(self.problem.slo.tpot_s / cfg.tpot_correction, self.p)
        return self._decode_rate[key]

    def counts_for_rate(self, cfg: Config, rate: float, kind: str) -> tuple[int, int, str | None]:
        """Fewest (prefill, decode) instances for `rate`, or the binding constraint."""
        slo = self.problem.slo
        rate_d = self.decode_rate_max(cfg, kind)
        if rate_d <= 0:
            return 0, 0, "tpot"
        num_d = max(1, math.ceil(rate / rate_d - 1e-9))
        budget = slo.ttft_s / cfg.ttft_correction - cfg.decode_side_ttft_s(rate / num_d, self.p)
        num_p = self.fewest_prefill(cfg, rate, budget)
        if num_p <= 0:
            return 0, 0, "ttft"
        for _ in range(MAX_BUMPS):
            est = cfg.estimate(num_p, num_d, rate, slo.ttft_s, slo.tpot_s, self.p)
            if est.binding is None:
                return num_p, num_d, None
            if est.binding == "ttft":
                num_p += 1
            else:
                num_d += 1
        return num_p, num_d, est.binding

    def fewest_prefill(self, cfg: Config, rate: float, ttft_budget_s: float) -> int:
        """The fewest prefill instances behind one router whose TTFT_p fits ttft_budget_s at `rate` (0: none
        does). As many independent queues as instances would need ceil(rate / one's rate): an upper bound, as
        one queue for all of them waits less (G/G/c); fewer than rate / capacity cannot keep up."""
        rate_alone = cfg.prefill_rate_max(ttft_budget_s, self.p) if ttft_budget_s > 0 else 0.0
        if rate_alone <= 0:
            return 0
        pm = cfg.prefill.model
        lo = max(1, math.ceil(rate / pm.capacity_per_s() - 1e-9))
        hi = max(lo, math.ceil(rate / rate_alone - 1e-9))

        def fits(n: int) -> bool:
            return sum(pm.ttft_parts_s(rate / n, self.p, n)) <= ttft_budget_s
        while lo < hi:          # fits is monotone in n: each instance gets less, and the pool is larger
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def max_rate(self, cfg: Config, num_p: int, num_d: int) -> float:
        slo = self.problem.slo
        hi = num_p * cfg.prefill.model.capacity_per_s()

        def ok(rate: float) -> bool:
            return cfg.estimate(num_p, num_d, rate, slo.ttft_s, slo.tpot_s, self.p).binding is None
        return bisect_max(ok, hi)

    def choice(self, cfg: Config, num_p: int, num_d: int, rate: float, kind: str) -> Choice:
        slo = self.problem.slo
        est = cfg.estimate(num_p, num_d, rate, slo.ttft_s, slo.tpot_s, self.p)
        return Choice(cfg, num_p, num_d, est, self.max_rate(cfg, num_p, num_d), kind)

    def link_kind(self) -> str:
        kind = self.problem.space.kv_link
        return "network" if kind == "auto" else kind

    # -- searches ------------------------------------------------------------------------------------
    def for_rate(self, rate: float) -> tuple[list[tuple[int, Config, int, int]], dict[str, int]]:
        kind = self.link_kind()
        found, failures = [], {}
        limit = self.problem.space.max_instances_per_role
        for cp in self.prefills:
            for cd in self.decodes:
                cfg = self.config(cp, cd, kind)
                num_p, num_d, binding = self.counts_for_rate(cfg, rate, kind)
                if binding is None and max(num_p, num_d) > limit:
                    binding = "instances"
                if binding is not None:
                    failures[binding] = failures.get(binding, 0) + 1
                    continue
                found.append((num_p * cp.tp + num_d * cd.tp, cfg, num_p, num_d))
        return found, failures

    def best_within_gpus(self, max_gpus: int) -> Choice | None:
        """The configuration within max_gpus that sustains the highest rate."""
        ranked = self.ranked_within_gpus(max_gpus, 1)
        return ranked[0] if ranked else None

    def ranked_within_gpus(self, max_gpus: int, count: int) -> list[Choice]:
        """The `count` configurations within max_gpus that sustain the highest rates, best first (among equal
        rates, the first found)."""
        kind = self.link_kind()
        slo = self.problem.slo
        top: list[tuple[float, int, tuple[Config, int, int]]] = []     # (-rate, order found, configuration)
        num_found = 0

        def floor() -> float:          # the rate a configuration must beat to enter the list
            return -top[-1][0] if len(top) == count else 0.0
        for cp in self.prefills:
            for cd in self.decodes:
                cfg = self.config(cp, cd, kind)
                rate_d = self.decode_rate_max(cfg, kind)
                if rate_d <= 0:
                    continue
                # an upper bound on each count's rate: decode at its highest rate per instance, prefill within
                # the TTFT left after the decode side's least (at a vanishing rate); only a count whose bound
                # beats the list is computed
                budget = slo.ttft_s - cfg.decode_side_ttft_s(1e-6, self.p)
                if budget <= 0 or cfg.prefill_rate_max(budget, self.p) <= 0:
                    continue
                for num_p in range(1, max_gpus // cp.tp + 1):
                    num_d = (max_gpus - num_p * cp.tp) // cd.tp
                    if num_d < 1:
                        break
                    if num_d * rate_d <= floor():
                        continue
                    bound = min(num_p * cfg.prefill_rate_max(budget, self.p, num_p), num_d * rate_d)
                    if bound > floor():
                        rate = self.max_rate(cfg, num_p, num_d)
                        if rate > floor():
                            top.append((-rate, num_found, (cfg, num_p, num_d)))
                            num_found += 1
                            top.sort(key=lambda t: t[:2])
                            del top[count:]
        return [self.choice(cfg, num_p, num_d, -neg_rate, kind) for neg_rate, _, (cfg, num_p, num_d) in top]


def plan_search(problem: PlanProblem, planner: Planner | None = None) -> SearchResult:
    """planner: Planner(problem), when the caller made it already."""
    planner = planner or Planner(problem)
    space = problem.space
    rate = planner.target_rate_per_s()
    result = SearchResult(planner.stats, planner.max_input_len, planner.max_seq_len, rate, None, False,
                          rejected=list(planner.rejected), planner=planner)
    context = problem.model.max_position_embeddings
    if planner.max_seq_len > context:   # the plan is still made (the curves allow it), but no engine can be built
        result.notes.append(f"the workload's longest prompt ({planner.max_input_len} tokens) plus its longest output "
                            f"({planner.max_seq_len - planner.max_input_len}) is {planner.max_seq_len} tokens, beyond "
                            f"{problem.model.name}'s context of {context} (max_position_embeddings): `trtpd build "
                            f"--plan` refuses it; cap the workload's lengths or choose a longer-context model")
    if not planner.prefills or not planner.decodes:
        return no_candidates(planner, result)
    if rate is None:
        if space.max_gpus is None:
            result.binding_constraint = "target"
            result.notes.append("give a target rate or a GPU budget")
            return result
        result.choice = planner.best_within_gpus(space.max_gpus)
        result.feasible = result.choice is not None
        if result.choice:
            result.rate_per_s = result.choice.max_rate_per_s
        return result
    found, failures = planner.for_rate(rate)
    if not found:
        return infeasible_rate(planner, result, failures)
    fewest = min(g for g, *_ in found)
    kind = planner.link_kind()
    tied = [planner.choice(cfg, n_p, n_d, rate, kind) for g, cfg, n_p, n_d in found if g == fewest]
    choice = max(tied, key=lambda c: c.max_rate_per_s)
    if space.max_gpus is not None and choice.num_gpus > space.max_gpus:
        result.binding_constraint = "gpu_budget"
        best = planner.best_within_gpus(space.max_gpus)
        result.nearest_feasible = {"num_gpus": float(choice.num_gpus)}
        if best is not None:
            result.nearest_feasible["rate_per_s"] = best.max_rate_per_s
        result.notes.append(f"the analytic estimate for {rate:.3g} requests/s needs {choice.num_gpus} GPUs; "
                            f"the budget is {space.max_gpus}")
        result.choice = best
        return result
    result.choice, result.feasible = choice, True
    return result
