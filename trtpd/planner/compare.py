"""Colocated against disaggregated, on the same data: each side's best configuration, its simulated
goodput (DistServe's: the highest rate at which the SLO attainment holds) next to its static estimate
(no queueing, no KV transfer), and which one to run, by how much and why. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from trtpd.perf.model import InstancePerf, instance_perf
from trtpd.planner.candidates import DecodeCandidate
from trtpd.planner.colocated import ColocatedCandidate, candidates_for, static_rate_per_s
from trtpd.planner.search import Choice, PlanProblem, Planner
from trtpd.planner.verify import cluster_for
from trtpd.sim.cluster import ClusterSpec
from trtpd.sim.attainment import AttainmentWatch
from trtpd.sim.goodput import max_goodput_rate_per_s, num_requests_measuring, settle_span_s
from trtpd.sim.metrics import SimSummary, latencies, summarize
from trtpd.sim.simulator import SimRun, Simulator, default_max_in_system
from trtpd.sim.workload import generate_requests

# a goodput search starts just below the static estimate (simulated goodput is mostly 0.9-1.1x of it), steps
# by GROWTH, and bisects until the bracket is within RESOLUTION of its low end (what a bracket of 2x bisected 5
# times gives), at most NUM_BISECTIONS times; given an estimate (the planner's searches all give one: the static
# estimate, or the disaggregated side's calibrated rate) it starts there and steps by RESOLUTION
START_SHARE = 0.9
GROWTH = 1.25
RESOLUTION = 1 / 32
NUM_BISECTIONS = 5
MAX_BUMPS = 3
RATE_CAP = 4.0          # a goodput search stops at this many times the static estimate


@dataclass
class Measured:
    """One simulated goodput search: the rate, and the run and summary at that rate."""
    rate_per_s: float
    summary: SimSummary | None
    run: SimRun | None
    ttft_miss: float = 0.0        # share of requests over the TTFT target just above that rate
    tpot_miss: float = 0.0        # (the lowest failing probe): which SLO gives way first


@dataclass
class Side:
    mode: str                                  # disaggregated | colocated
    label: str
    num_gpus: int
    tp: dict[str, int]
    num_instances: dict[str, int]
    max_batch_size: dict[str, int]
    max_num_tokens: dict[str, int]
    static_rate_per_s: float                   # no queueing, no transfer
    measured: Measured
    perf_source: str
    policy: str | None = None
    meets_target: bool | None = None           # target mode: the simulation at the target rate passed
    target_summary: SimSummary | None = None
    colocated: ColocatedCandidate | None = None

    @property
    def goodput_per_gpu_per_s(self) -> float:
        return self.measured.rate_per_s / self.num_gpus

    @property
    def static_per_gpu_per_s(self) -> float:
        return self.static_rate_per_s / self.num_gpus

    def busy_shares(self) -> dict[str, float]:
        run = self.measured.run
        if run is None:
            return {}
        out: dict[str, list[float]] = {}
        for u in run.usage:
            out.setdefault(u.role, []).append(u.busy_share)
        return {role: sum(v) / len(v) for role, v in out.items()}


@dataclass
class Recommendation:
    recommended: str | None
    ratio_per_gpu: float                       # recommended / other, simulated goodput per GPU
    reasons: list[str] = field(default_factory=list)
    disaggregated: Side | None = None
    colocated: Side | None = None


class Goodput:
    """Simulated goodput searches on one workload, SLO and request count."""

    def __init__(self, problem: PlanProblem, num_requests: int, seed: int) -> None:
        self.problem, self.num_requests, self.seed = problem, num_requests, seed
        # requests arriving in the warm-up (decode batches fill) or in the cool-down of the same span (they
        # live on into the drain after the last arrival) are not measured: a probe of 6,000 requests at 240
        # requests/s on 12 colocated instances measured without a cool-down passed at 99.5% where the same
        # rate, run on, meets 0%
        self.warmup_s = settle_span_s(problem.workload.output_stats().max, problem.slo.tpot_s)

    def _num_requests(self, rate: float) -> int:
        return num_requests_measuring(self.num_requests, rate, self.warmup_s)

    def _simulator(self, cluster: ClusterSpec, rate: float) -> Simulator:
        requests = generate_requests(self.problem.workload, rate, self._num_requests(rate), self.seed)
        return Simulator(cluster, requests, max_in_system=default_max_in_system(cluster))

    def _finish(self, sim: Simulator) -> tuple[SimRun, SimSummary, float, float]:
        """Runs the simulation to its end (or on from where it stopped): the run, its summary, and the
        shares of requests that miss TTFT and TPOT."""
        return self._measure(sim.run())

    def _measure(self, run: SimRun) -> tuple[SimRun, SimSummary, float, float]:
        slo = self.problem.slo
        lat = latencies(run, warmup_s=self.warmup_s, cooldown_s=self.warmup_s)
        ttft_miss = float((~lat.done | (lat.ttft_s > slo.ttft_s)).mean()) if len(lat.done) else 1.0
        tpot_miss = float((lat.tpot_s > slo.tpot_s).mean()) if len(lat.done) else 1.0
        return (run, summarize(run, slo.ttft_s, slo.tpot_s, warmup_s=self.warmup_s, cooldown_s=self.warmup_s),
                ttft_miss, tpot_miss)

    def _run(self, cluster: ClusterSpec, rate: float) -> tuple[SimRun, SimSummary, float, float]:
        return self._finish(self._simulator(cluster, rate))

    def passes(self, cluster: ClusterSpec, rate: float) -> tuple[bool, SimSummary]:
        ok, summary, _ = self.run_at(cluster, rate)
        return ok, summary

    def _decided(self, cluster: ClusterSpec, rate: float) -> tuple[Simulator, bool | None]:
        """The probe at `rate`, run until its pass or fail is certain (AttainmentWatch): the simulator (go on
        with _finish) and True/False, or None when it ran to its end undecided (decide it from _finish)."""
        slo = self.problem.slo
        sim = self._simulator(cluster, rate)
        watch = AttainmentWatch(sim.records, slo.ttft_s, slo.tpot_s, slo.attainment, warmup_s=self.warmup_s,
                                response_latency_s=cluster.response_latency_s, cooldown_s=self.warmup_s)
        return sim, (None if sim.run_until_decided(watch) else bool(watch.passed))

    def reaches(self, cluster: ClusterSpec, rate: float, static_rate_per_s: float) -> bool:
        """Whether the probe a search would run at `rate` passes (it stops once that is certain). With the
        SLO attainment falling as the rate rises (the same requests, closer together), a failing one says
        the goodput is below `rate` in one probe, where a search takes two to five."""
        if static_rate_per_s > 0 and rate > RATE_CAP * static_rate_per_s:
            return False
        sim, passed = self._decided(cluster, rate)
        if passed is not None:
            return passed
        return (self._finish(sim)[1].slo_attainment or 0.0) >= self.problem.slo.attainment

    def run_at(self, cluster: ClusterSpec, rate: float) -> tuple[bool, SimSummary, SimRun]:
        """The probe a search would run at `rate`, to its end: whether it passes, its summary and run (a
        search given that run as `known` starts from it instead of simulating it again)."""
        run, summary, _, _ = self._run(cluster, rate)
        return (summary.slo_attainment or 0.0) >= self.problem.slo.attainment, summary, run

    def search(self, cluster: ClusterSpec, static_rate_per_s: float,
               give_up: Callable[[float], bool] | None = None, decide_early: bool = True,
               known: tuple[float, SimRun] | None = None, estimate_per_s: float | None = None) -> Measured | None:
        """Starts at START_SHARE of the static estimate; rates over RATE_CAP x static count as misses.
        give_up(hi): see max_goodput_rate_per_s; None when it stopped the search (the goodput is below hi).
        decide_early: a probe's simulation stops once its pass or fail is certain (AttainmentWatch); only
        the two whose figures the answer quotes (the goodput and the lowest failing rate) run on to the
        end, as they would have without stopping.
        known: (rate, a whole run of this cluster at that rate that passed, e.g. the plan's verification at
        the target, or run_at's): the search starts there, with that run's figures as its probe there,
        instead of at START_SHARE of the static estimate (one passing probe fewer).
        estimate_per_s: a goodput estimate good to a few percent (a colocated candidate's static estimate,
        or the disaggregated model calibrated by a simulation of this cluster): the search starts there (or
        at the known rate, if higher) and steps by RESOLUTION, so that two probes bracket an estimate within
        one step of the answer (a search from 1.25x bisected to RESOLUTION takes four)."""
        slo = self.problem.slo
        seen: dict[float, tuple[SimRun, SimSummary, float, float]] = {}
        stopped: dict[float, Simulator] = {}       # decided early, not yet run to the end
        start_rate_per_s = START_SHARE * static_rate_per_s if known is None else known[0]
        growth = GROWTH
        if estimate_per_s is not None and estimate_per_s > 0:
            start_rate_per_s, growth = max(estimate_per_s, start_rate_per_s if known else 0.0), 1 + RESOLUTION

        def probe(cluster_, workload, rate, ttft_s, tpot_s, num_requests, seed) -> float:
            if known is not None and rate == known[0]:
                seen[rate] = self._measure(known[1])
                return seen[rate][1].slo_attainment or 0.0
            if static_rate_per_s > 0 and rate > RATE_CAP * static_rate_per_s:
                return 0.0
            if decide_early:
                sim, passed = self._decided(cluster_, rate)
                if passed is not None:
                    stopped[rate] = sim        # only pass or fail matters to the search
                    return slo.attainment if passed else 0.0
            else:
                sim = self._simulator(cluster_, rate)
            seen[rate] = self._finish(sim)
            return seen[rate][1].slo_attainment or 0.0

        def full(rate: float) -> tuple[SimRun, SimSummary, float, float]:
            if rate in stopped:
                seen[rate] = self._finish(stopped.pop(rate))
            return seen[rate]
        g = max_goodput_rate_per_s(cluster, self.problem.workload, slo.ttft_s, slo.tpot_s, slo.attainment,
                                   self.num_requests, self.seed, max(start_rate_per_s, 1e-3), NUM_BISECTIONS, probe,
                                   give_up, growth, RESOLUTION)
        if g.gave_up:
            return None
        probed = set(seen) | set(stopped)
        if g.rate_per_s <= 0 or g.rate_per_s not in probed:
            return Measured(0.0, None, None, 1.0, 1.0)
        run, summary, ttft_miss, tpot_miss = full(g.rate_per_s)
        failing = [r for r in probed if r > g.rate_per_s]
        if failing:
            _, _, ttft_miss, tpot_miss = full(min(failing))
        return Measured(g.rate_per_s, summary, run, ttft_miss, tpot_miss)


# -- disaggregated -------------------------------------------------------------------------------------
def disaggregated_side(planner: Planner, choice: Choice, goodput: Goodput, rate: float | None,
                       at_target: tuple[bool, SimSummary] | None = None,
                       verified: tuple[float, SimRun] | None = None) -> Side:
    """at_target: whether these counts met the SLOs at the target rate, and that run's summary, when the
    plan's verification already simulated them there (else simulated here).
    verified: (rate, run) of the verification's passing run of these counts: the goodput search starts
    from it (Goodput.search's `known`), guided by the choice's highest rate, whose model that run
    calibrated (within 2-5% below the simulated goodput on the benchmark plans)."""
    cfg, space = choice.config, planner.problem.space
    cluster = cluster_for(cfg.prefill, cfg.decode, choice.num_prefill, choice.num_decode, cfg.link,
                          space.tokens_per_block, space.first_token_at)
    static = disaggregated_static_rate_per_s(planner, choice)
    measured = goodput.search(cluster, static or rate or choice.max_rate_per_s, known=verified,
                              estimate_per_s=choice.max_rate_per_s if verified is not None else None)
    side = Side("disaggregated", f"{choice.num_prefill}P(TP{cfg.prefill.tp})+{choice.num_decode}D(TP{cfg.decode.tp})",
                choice.num_gpus, {"prefill": cfg.prefill.tp, "decode": cfg.decode.tp},
                {"prefill": choice.num_prefill, "decode": choice.num_decode},
                {"prefill": cfg.prefill.scheduler.max_batch_size, "decode": cfg.decode.max_batch_size},
                {"prefill": cfg.prefill.scheduler.max_num_tokens, "decode": cfg.decode.max_batch_size},
                static, measured, cfg.decode.inst.source)
    if rate is not None:
        side.meets_target, side.target_summary = at_target or goodput.passes(cluster, rate)
    return side


def disaggregated_static_rate_per_s(planner: Planner, choice: Choice) -> float:
    """Prefill at full batches while the p-quantile prompt's batch fits TTFT; decode at the largest batch
    meeting TPOT (Little's law); no queueing, no KV transfer."""
    cfg, slo = choice.config, planner.problem.slo
    pm, dm = cfg.prefill.model, cfg.decode.model
    l_p = planner.stats.input.quantile(slo.attainment)
    rate_p = pm.capacity_per_s() if pm.batch_s(min(pm.max_num_tokens, l_p)) <= slo.ttft_s else 0.0
    rate_d = dm.max_batch_size / (dm.steps_mean * dm.step_s(dm.max_batch_size))
    return min(choice.num_prefill * rate_p, choice.num_decode * rate_d)


# -- colocated -----------------------------------------------------------------------------------------
def colocated_inst(problem: PlanProblem, decode: DecodeCandidate) -> InstancePerf:
    """The decode candidate's instance as a colocated one: the same engine and KV, with the colocated serving path
    the profile measured (CPU profiles; on GPUs it is the decode candidate's as it is)."""
    s = problem.space
    colocated = instance_perf(problem.model, problem.hardware, decode.tp, s.weight_dtype, s.kv_dtype, "colocated")
    return replace(decode.inst, perf=colocated.perf, response_latency_s=colocated.response_latency_s,
                   shared_cores=colocated.shared_cores)


def shortlist(planner: Planner) -> list[tuple[ColocatedCandidate, float]]:
    """Per TP: inflight, and chunked at the smallest budget within 2% of its best static rate; TP degrees
    whose static rate per GPU is under 60% of the best are dropped (the simulation rarely moves a
    configuration by more than that relative to the others)."""
    problem = planner.problem
    per_tp: list[list[tuple[ColocatedCandidate, float]]] = []
    for d in planner.decodes:
        memo: dict = {}        # the TP's mixed step times, shared by its candidates
        cands = [(c, static_rate_per_s(c, planner.stats, problem.slo, memo))
                 for c in candidates_for(d, planner.max_input_len, inst=colocated_inst(problem, d))]
        inflight = [x for x in cands if x[0].policy == "inflight"]
        chunked = [x for x in cands if x[0].policy == "chunked"]
        best = max(r for _, r in chunked)
        small = next(x for x in chunked if x[1] >= 0.98 * best)
        per_tp.append([x for x in inflight + [small] if x[1] > 0])
    best_per_gpu = max((r / c.tp for group in per_tp for c, r in group), default=0.0)
    return [(c, r) for group in per_tp for c, r in group if r / c.tp >= 0.6 * best_per_gpu]


Found = tuple[int, tuple, int, float, Measured]   # (shortlist index, key, instances, static rate, goodput)


def colocated_side(planner: Planner, goodput: Goodput, rate: float | None, max_gpus: int | None,
                   prune: bool = True) -> Side | None:
    """The best colocated configuration of the shortlist, by simulated goodput."""
    candidates = shortlist(planner)
    order = search_order(candidates, rate, max_gpus) if prune else list(range(len(candidates)))
    return best_colocated(planner, goodput, rate, max_gpus, candidates,
                          search_colocated(planner, goodput, rate, max_gpus, candidates, order, prune))


def search_order(candidates: list[tuple[ColocatedCandidate, float]], rate: float | None,
                 max_gpus: int | None) -> list[int]:
    return sorted(range(len(candidates)), key=lambda i: _promise(candidates[i], rate, max_gpus))


def search_colocated(planner: Planner, goodput: Goodput, rate: float | None, max_gpus: int | None,
                     candidates: list[tuple[ColocatedCandidate, float]], order: list[int],
                     prune: bool = True) -> list[Found]:
    """Each candidate's goodput, in `order`. prune: a candidate's search stops as soon as its goodput is
    certain to lose to the best found so far (`_Best.loses`); it is left out. With a budget, a candidate is
    first probed once at the best's goodput plus RESOLUTION (`Goodput.reaches`), and left out when it fails
    there: it cannot beat the best by more than the figures resolve, and that one probe (mostly stopped
    early) replaces a search of two to five. Searches start at the candidate's static estimate. What is
    left has the same best (best_colocated) as searching every candidate to the end or, with a budget, one
    whose goodput is within RESOLUTION of it, with the figures of its own search to the end
    (tests/unit/planner/test_pruning.py)."""
    tpb = planner.problem.space.tokens_per_block
    best = _Best(rate, max_gpus)
    found: list[Found] = []
    for i in order:
        c, static = candidates[i]
        give_up = (lambda hi, c=c: best.loses(c.tp, hi)) if prune else None
        if rate is None:                       # a budget: fill it with instances of this TP
            assert max_gpus is not None
            num = max_gpus // c.tp
            if num < 1:
                continue
            cluster = c.cluster(num, tpb)
            if prune and best.key is not None and -best.key[0] > 0 and \
                    not goodput.reaches(cluster, -best.key[0] * (1 + RESOLUTION), static * num):
                continue                       # not above the best's goodput by more than the resolution
            m = goodput.search(cluster, static * num, give_up, estimate_per_s=static * num)
            if m is None:
                continue
            key: tuple = (-m.rate_per_s, num * c.tp)
            found.append((i, key, num, static * num, m))
        else:                                   # a target: one instance's goodput sizes the count
            m = goodput.search(c.cluster(1, tpb), static, give_up, estimate_per_s=static)
            if m is None or m.rate_per_s <= 0:
                continue
            num = max(1, math.ceil(rate / m.rate_per_s - 1e-9))
            if max_gpus is not None and num * c.tp > max_gpus:
                continue
            key = (num * c.tp, -m.rate_per_s / c.tp)
            found.append((i, key, num, static, m))
        best.add(key)
    return found


def best_colocated(planner: Planner, goodput: Goodput, rate: float | None, max_gpus: int | None,
                   candidates: list[tuple[ColocatedCandidate, float]], found: list[Found]) -> Side | None:
    """The smallest key (the first in shortlist order among equals), as a Side."""
    chosen = confirm_colocated(planner, goodput, rate, max_gpus, candidates, found)
    return None if chosen is None else colocated_side_of(candidates[chosen[0]][0], chosen)


Chosen = tuple[int, int, float, Measured, bool | None, SimSummary | None]  # index, instances, static, goodput,
#                                                                           meets target, summary at target


def confirm_colocated(planner: Planner, goodput: Goodput, rate: float | None, max_gpus: int | None,
                      candidates: list[tuple[ColocatedCandidate, float]], found: list[Found]) -> Chosen | None:
    """The smallest key (the first in shortlist order among equals); with a target, its count is then
    confirmed at the target rate (one more instance while it misses) and its goodput searched again."""
    if not found:
        return None
    tpb = planner.problem.space.tokens_per_block
    i, _, num, static, m = min(sorted(found, key=lambda f: f[0]), key=lambda f: f[1])
    c = candidates[i][0]
    meets, target_summary = None, None
    if rate is not None:
        for _ in range(MAX_BUMPS):
            meets, target_summary, target_run = goodput.run_at(c.cluster(num, tpb), rate)
            if meets or (max_gpus is not None and (num + 1) * c.tp > max_gpus):
                break
            num += 1
        static *= num
        # the run at the target is the search's probe there: it starts from it when it passed
        m_num = goodput.search(c.cluster(num, tpb), static, known=(rate, target_run) if meets else None,
                              estimate_per_s=static)
        assert m_num is not None
        m = m_num
    return i, num, static, m, meets, target_summary


def candidate_key(c: ColocatedCandidate) -> tuple[int, str, int]:
    """What names a colocated candidate among a planner's (it pickles; the candidate's performance model
    need not)."""
    return c.tp, c.policy, c.max_num_tokens


def candidate_of(planner: Planner, key: tuple[int, str, int]) -> ColocatedCandidate:
    """The candidate candidate_key names, made again from the planner's decode candidates (without the
    shortlist's static estimates)."""
    for d in planner.decodes:
        if d.tp == key[0]:
            for c in candidates_for(d, planner.max_input_len, inst=colocated_inst(planner.problem, d)):
                if candidate_key(c) == key:
                    return c
    raise KeyError(f"no colocated candidate {key}")


def colocated_side_of(c: ColocatedCandidate, chosen: Chosen) -> Side:
    """chosen: confirm_colocated's answer, whose candidate is c."""
    _, num, static, m, meets, target_summary = chosen
    return Side("colocated", f"{num}x TP{c.tp} {c.policy}", num * c.tp, {"colocated": c.tp}, {"colocated": num},
                {"colocated": c.max_batch_size}, {"colocated": c.max_num_tokens}, static, m, c.inst.source,
                policy=c.policy, meets_target=meets, target_summary=target_summary, colocated=c)


def _promise(candidate: tuple[ColocatedCandidate, float], rate: float | None, max_gpus: int | None) -> tuple:
    """Search order (most promising first, by the static estimate); any order gives the same answer."""
    c, static = candidate
    if rate is None:
        assert max_gpus is not None
        return (-static * (max_gpus // c.tp), c.tp)
    num = max(1, math.ceil(rate / static)) if static > 0 else math.inf
    return (num * c.tp, -static / c.tp)


class _Best:
    """The best colocated key found so far (the smallest: budget (-goodput, GPUs); target (GPUs, -goodput
    per GPU)), and whether a candidate whose goodput is below hi can still beat it."""

    def __init__(self, rate: float | None, max_gpus: int | None) -> None:
        self.rate, self.max_gpus = rate, max_gpus
        self.key: tuple | None = None

    def add(self, key: tuple) -> None:
        if self.key is None or key < self.key:
            self.key = key

    def loses(self, tp: int, hi: float) -> bool:
        """True when every goodput g < hi gives a key above the best (or no key at all)."""
        if self.rate is None:                  # key (-g, GPUs): -g > -hi >= best's -goodput
            return self.key is not None and -hi >= self.key[0]
        # num(g) = ceil(rate / g - 1e-9) can only grow as g falls below hi
        num = max(1, math.ceil(self.rate / hi - 1e-9))
        if self.max_gpus is not None and num * tp > self.max_gpus:
            return True                        # over the budget: never a key
        if self.key is None:
            return False
        gpus, neg_per_gpu = self.key           # (strictly: g < hi gives -g / tp >= -hi / tp after rounding)
        return num * tp > gpus or (num * tp == gpus and -hi / tp > neg_per_gpu)


# -- the answer ----------------------------------------------------------------------------------------
def decide(disagg: Side | None, coloc: Side | None, rate: float | None) -> Recommendation:
    sides = [s for s in (disagg, coloc) if s is not None and s.measured.rate_per_s > 0]
    if rate is not None:
        passing = [s for s in sides if s.meets_target]
        sides = passing or sides
        key = (lambda s: (s.num_gpus, -s.goodput_per_gpu_per_s)) if passing else (lambda s: -s.goodput_per_gpu_per_s)
    else:
        key = lambda s: (-s.measured.rate_per_s, s.num_gpus)  # noqa: E731
    if not sides:
        return Recommendation(None, 0.0, ["neither side meets the SLOs in simulation"], disagg, coloc)
    best = min(sides, key=key)
    other = coloc if best is disagg else disagg
    ratio = (best.goodput_per_gpu_per_s / other.goodput_per_gpu_per_s
             if other is not None and other.goodput_per_gpu_per_s > 0 else math.inf)
    return Recommendation(best.mode, ratio, reasons(best, other, rate), disagg, coloc)


def _binding(side: Side) -> str:
    m = side.measured
    which = "TTFT" if m.ttft_miss >= m.tpot_miss else "TPOT"
    return (f"{which} gives way first (just above that rate {m.ttft_miss:.0%} of requests miss TTFT, "
            f"{m.tpot_miss:.0%} TPOT)")


def reasons(best: Side, other: Side | None, rate: float | None) -> list[str]:
    out = []
    if other is None:
        return [f"only {best.mode} has a configuration that meets the SLOs"]
    if rate is not None and best.meets_target and not other.meets_target:
        out.append(f"{other.mode} does not meet the SLOs at the target within the GPUs tried")
    elif rate is not None and best.num_gpus < other.num_gpus:
        out.append(f"{best.mode} meets the target with {best.num_gpus} GPUs, {other.mode} needs {other.num_gpus}")
    for s in (best, other):
        kept = s.measured.rate_per_s / s.static_rate_per_s if s.static_rate_per_s > 0 else 0.0
        busy = ", ".join(f"{role} busy {share:.0%}" for role, share in s.busy_shares().items())
        cost = "queueing and KV transfer" if s.mode == "disaggregated" else "queueing and prefill-decode interference"
        out.append(f"{s.mode} {s.label}: simulated goodput {s.goodput_per_gpu_per_s:.3g} req/s/GPU is "
                   f"{kept:.0%} of its static {s.static_per_gpu_per_s:.3g} ({cost}); {_binding(s)}; {busy}")
    if best.mode == "colocated":
        out.append("every colocated GPU does both phases, so none idles; disaggregation's whole instances "
                   "per role leave capacity unused at this input/output mix and these SLOs")
    else:
        out.append("disaggregation removes prefill-decode interference: decode steps carry no prompts, so "
                   "batches can grow to the TPOT limit while prefill meets TTFT on its own GPUs")
    return out
