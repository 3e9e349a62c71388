"""The colocated search's pruning: a candidate's goodput search stops only once its goodput is certain to
lose to the best found (trtpd.planner.compare._Best); with a budget, a candidate that fails one probe at the
best's goodput plus the search's resolution (1/32) is not searched (it cannot beat the best by more than
the figures resolve). So the side chosen with pruning is the side chosen by searching every candidate to the
end, figure for figure, or, with a budget, one whose goodput is within that resolution of it, with the
figures its own search to the end gives."""

import math

import numpy as np
import pytest

from trtpd.catalog import get_model
from trtpd.perf.hardware import load_hardware
from trtpd.planner import compare
from trtpd.planner.inputs import SearchSpace, Slo, Target
from trtpd.planner.search import PlanProblem, Planner
from trtpd.sim.goodput import max_goodput_rate_per_s
from trtpd.sim.lengths import FixedLengths
from trtpd.sim.workload import load_workload


def _problem(model, inputs, outputs, ttft_s, tpot_s, target, max_gpus, tp=(1, 2, 4)):
    wl = load_workload("chat-powerlaw")
    if inputs:
        wl = wl.model_copy(update={"input_tokens": FixedLengths(kind="fixed", tokens=inputs),
                                   "output_tokens": FixedLengths(kind="fixed", tokens=outputs), "name": "fixed"})
    return PlanProblem(get_model(model), load_hardware("h100-sxm"), wl, Slo(ttft_s=ttft_s, tpot_s=tpot_s), target,
                       SearchSpace(tp_prefill=list(tp), tp_decode=list(tp), max_gpus=max_gpus))


CASES = {   # budget and target mode, fixed and mixed lengths, models whose TP degrees compete
    "budget-70b-fixed": _problem("llama-3.1-70b", 512, 256, 0.2, 0.04, None, 8, tp=(2, 4)),
    "budget-8b-chat": _problem("llama-3.1-8b", None, None, 0.3, 0.03, None, 4),
    "target-70b-fixed": _problem("llama-3.1-70b", 512, 128, 0.3, 0.05, Target(rate_per_s=20), None, tp=(2, 4)),
    "target-8b-chat-budget": _problem("llama-3.1-8b", None, None, 0.3, 0.03, Target(rate_per_s=30), 6),
}


@pytest.fixture()
def simulated_rates(monkeypatch) -> list[float]:
    """The rate of every simulation a Goodput sets up, in order."""
    rates: list[float] = []
    simulator = compare.Goodput._simulator

    def counted(self, cluster, rate):
        rates.append(rate)
        return simulator(self, cluster, rate)
    monkeypatch.setattr(compare.Goodput, "_simulator", counted)
    return rates


def _figures(side):
    m = side.measured
    return (side.label, side.num_gpus, side.num_instances, side.static_rate_per_s, side.meets_target,
            m.rate_per_s, m.ttft_miss, m.tpot_miss, m.summary, side.target_summary, side.busy_shares())


def unpruned_sides(planner, goodput, rate, max_gpus) -> dict:
    """Every shortlisted candidate searched to the end, as the side it would be, by label."""
    candidates = compare.shortlist(planner)
    found = compare.search_colocated(planner, goodput, rate, max_gpus, candidates, list(range(len(candidates))),
                                     prune=False)
    sides = [compare.best_colocated(planner, goodput, rate, max_gpus, candidates, [f]) for f in found]
    return {side.label: side for side in sides}


def check_pruned_choice(pruned_label: str, pruned_rate: float, full, sides: dict, budget: bool) -> None:
    """The pruned choice against the unpruned best `full`: the same side, or (a budget) a side whose
    goodput is within the resolution of it; its figures are its own unpruned search's either way."""
    assert pruned_label in sides
    if budget:
        assert pruned_rate * (1 + compare.RESOLUTION) > full.measured.rate_per_s
    else:
        assert pruned_label == full.label


@pytest.mark.parametrize("order", ["promise", "reversed"])
@pytest.mark.parametrize("name", list(CASES))
def test_pruned_search_chooses_the_same_side(name, order, monkeypatch, simulated_rates):
    """In the planner's order (most promising first) and the reverse (the best found last)."""
    problem = CASES[name]
    if order == "reversed":
        promise = compare._promise
        monkeypatch.setattr(compare, "_promise", lambda *a: tuple(-x for x in promise(*a)))
    planner = Planner(problem)
    rate = problem.target.requests_per_s(planner.stats.mean_tokens_per_request) if problem.target else None
    runs = simulated_rates
    goodput = compare.Goodput(problem, 300, 0)
    full = compare.colocated_side(planner, goodput, rate, problem.space.max_gpus, prune=False)
    num_full, runs[:] = len(runs), []
    pruned = compare.colocated_side(planner, goodput, rate, problem.space.max_gpus, prune=True)
    num_pruned = len(runs)
    assert full is not None and pruned is not None
    sides = unpruned_sides(planner, goodput, rate, problem.space.max_gpus)
    check_pruned_choice(pruned.label, pruned.measured.rate_per_s, full, sides, rate is None)
    assert _figures(pruned) == _figures(sides[pruned.label])
    assert len(compare.shortlist(planner)) > 1
    assert num_pruned <= num_full
    if rate is None and order == "promise":   # the challenge probes skipped searches (with a target, searches
        assert num_pruned < num_full          # started at the static estimate take 2-3 probes: none to skip)


@pytest.mark.parametrize("rate", [None, 7.5, 31.0])
def test_a_pruned_candidate_cannot_win(rate):
    """Whenever loses(tp, hi) holds, every goodput below hi gives a key above the best (or none)."""
    rng = np.random.default_rng(1)
    for _ in range(3000):
        max_gpus = int(rng.choice([4, 8, 16])) if rate is not None and rng.random() < 0.5 else 16
        best = compare._Best(rate, max_gpus if rate is not None else None)
        tp = int(rng.choice([1, 2, 4, 8]))
        g_best = float(rng.uniform(0.5, 40))
        tp_best = int(rng.choice([1, 2, 4, 8]))
        if rate is None:
            best.add((-g_best, max_gpus // tp_best * tp_best))
        else:
            best.add((max(1, math.ceil(rate / g_best - 1e-9)) * tp_best, -g_best / tp_best))
        hi = float(rng.choice([g_best, g_best * tp / tp_best, rng.uniform(0.5, 60)]))
        if not best.loses(tp, hi):
            continue
        for g in np.concatenate([rng.uniform(1e-3, hi, 20), [np.nextafter(hi, 0), hi * (1 - 1e-12)]]):
            g = float(g)
            if rate is None:
                key = (-g, max_gpus // tp * tp)
            else:
                num = max(1, math.ceil(rate / g - 1e-9))
                if max_gpus is not None and num * tp > max_gpus:
                    continue                             # over the budget: never a key
                key = (num * tp, -g / tp)
            assert key > best.key, (rate, tp, hi, g, best.key)


def test_goodput_search_gives_up_only_below_the_answer():
    def probe(cluster, workload, rate, ttft_s, tpot_s, n, seed):
        return 1.0 if rate <= 13.7 else 0.5
    full = max_goodput_rate_per_s(None, None, 1, 1, 0.9, start_rate_per_s=1.0, num_bisections=12, probe=probe)
    asked = []

    def give_up(hi):
        asked.append(hi)
        return hi <= 14.0
    g = max_goodput_rate_per_s(None, None, 1, 1, 0.9, start_rate_per_s=1.0, num_bisections=12, probe=probe,
                               give_up=give_up)
    assert g.gave_up and full.rate_per_s < g.rate_per_s <= 14.0 and len(g.probes) < len(full.probes)
    assert asked and all(hi > 13.7 for hi in asked)     # asked after failing probes only
    never = max_goodput_rate_per_s(None, None, 1, 1, 0.9, start_rate_per_s=1.0, num_bisections=12, probe=probe,
                                   give_up=lambda hi: False)
    assert not never.gave_up and never == full


@pytest.mark.parametrize("name", ["budget-70b-fixed", "target-8b-chat-budget"])
def test_goodput_search_decided_early_measures_the_same(name, monkeypatch):
    """Probes that stop once their pass or fail is certain leave the search and its quoted figures as
    they are; the stopped probes simulated fewer requests."""
    problem = CASES[name]
    planner = Planner(problem)
    goodput = compare.Goodput(problem, 300, 0)
    tpb = problem.space.tokens_per_block
    clusters = [c.cluster(max(1, (problem.space.max_gpus or 4) // c.tp), tpb) for c, _ in compare.shortlist(planner)]
    finished = []
    finish = compare.Goodput._finish

    def counted(self, sim):
        finished.append(sim)
        return finish(self, sim)
    monkeypatch.setattr(compare.Goodput, "_finish", counted)
    for cluster, (_, static) in list(zip(clusters, compare.shortlist(planner)))[:2]:
        slow = goodput.search(cluster, static * cluster.decode.num_instances, decide_early=False)
        num_slow, finished[:] = len(finished), []
        fast = goodput.search(cluster, static * cluster.decode.num_instances)
        assert (fast.rate_per_s, fast.ttft_miss, fast.tpot_miss, fast.summary) == \
            (slow.rate_per_s, slow.ttft_miss, slow.tpot_miss, slow.summary)
        assert [u.busy_share for u in fast.run.usage] == [u.busy_share for u in slow.run.usage]
        assert len(finished) <= 2 < num_slow            # only the quoted probes ran to the end
        finished[:] = []


@pytest.mark.parametrize("name", list(CASES))
def test_static_rates_with_the_step_memo_are_the_same(name):
    """shortlist shares one memo of mixed step times between a TP's candidates: the same static rates."""
    from trtpd.planner.colocated import candidates_for, static_rate_per_s
    planner = Planner(CASES[name])
    slo = CASES[name].slo
    num_hits = 0
    for d in planner.decodes:
        memo: dict = {}
        for c in candidates_for(d, planner.max_input_len):
            size = len(memo)
            assert static_rate_per_s(c, planner.stats, slo, memo) == static_rate_per_s(c, planner.stats, slo)
            num_hits += size > 0
    assert num_hits                                     # later candidates met steps computed before
    shortlisted = compare.shortlist(planner)
    assert [r for _, r in shortlisted] == [static_rate_per_s(c, planner.stats, slo) for c, _ in shortlisted]


def test_a_search_started_from_a_known_run_does_not_simulate_it_again(simulated_rates):
    """Goodput.search(known=(rate, run)): the run stands for the probe at that rate (no simulation there)
    and the search starts from it. Where the known rate is the search's own start, the figures are those of
    the search that simulates that probe itself."""
    problem = CASES["target-70b-fixed"]
    planner = Planner(problem)
    goodput = compare.Goodput(problem, 300, 0)
    c, static = compare.shortlist(planner)[0]
    cluster = c.cluster(2, problem.space.tokens_per_block)
    rate = compare.START_SHARE * (2 * static)      # where a search of two instances starts
    ok, summary, run = goodput.run_at(cluster, rate)
    assert ok
    simulated = simulated_rates
    simulated.clear()
    seeded = goodput.search(cluster, 2 * static, known=(rate, run))
    seeded_rates, simulated[:] = list(simulated), []
    plain = goodput.search(cluster, 2 * static)
    assert rate not in seeded_rates and seeded_rates[0] == rate * compare.GROWTH
    assert simulated[0] == rate and simulated[1:] == seeded_rates        # one simulation fewer
    assert (seeded.rate_per_s, seeded.ttft_miss, seeded.tpot_miss, seeded.summary) == \
        (plain.rate_per_s, plain.ttft_miss, plain.tpot_miss, plain.summary)
    assert seeded.rate_per_s >= rate


def test_a_budget_no_candidate_meets_is_searched_without_a_challenge_at_rate_zero(simulated_rates, monkeypatch):
    """When the best found has goodput 0 (nothing met the SLOs), the next candidates are searched (there is
    no rate to beat), never probed at rate 0."""
    problem = CASES["budget-8b-chat"]
    planner = Planner(problem)
    searched = []

    def nothing_meets(self, cluster, static_rate_per_s, give_up=None, decide_early=True, known=None,
                      estimate_per_s=None):
        searched.append(cluster.decode.num_instances)
        return compare.Measured(0.0, None, None, 1.0, 1.0)
    monkeypatch.setattr(compare.Goodput, "search", nothing_meets)
    candidates = compare.shortlist(planner)
    found = compare.search_colocated(planner, compare.Goodput(problem, 200, 0), None, problem.space.max_gpus,
                                     candidates, compare.search_order(candidates, None, problem.space.max_gpus))
    assert len(candidates) > 1 and len(searched) == len(found) == len(candidates)
    assert simulated_rates == []            # no challenge probe (it would have been at rate 0)


def test_a_search_guided_by_an_estimate_brackets_it_in_two_probes(simulated_rates):
    """Goodput.search(estimate_per_s=...): from an estimate within one step (RESOLUTION) below the answer the
    search takes two probes (pass there, fail one step above), where a search from the static estimate takes
    about five; from any estimate nearby it ends within RESOLUTION of the unguided answer, at a rate that
    passed with the next step up failing."""
    from trtpd.planner.search import plan_search
    from trtpd.planner.verify import cluster_for
    problem = CASES["target-70b-fixed"]
    choice = plan_search(problem).choice
    cfg, space = choice.config, problem.space
    cluster = cluster_for(cfg.prefill, cfg.decode, choice.num_prefill, choice.num_decode, cfg.link,
                          space.tokens_per_block, space.first_token_at)
    goodput = compare.Goodput(problem, 300, 0)
    static = compare.disaggregated_static_rate_per_s(Planner(problem), choice)
    simulated_rates.clear()
    plain = goodput.search(cluster, static)
    num_plain, g = len(simulated_rates), plain.rate_per_s
    assert g > 0 and num_plain >= 4
    for estimate in (g, g * (1 - compare.RESOLUTION / 2), g * 0.95, g * 1.03):
        simulated_rates.clear()
        guided = goodput.search(cluster, static, estimate_per_s=estimate)
        r = guided.rate_per_s
        assert abs(r - g) <= compare.RESOLUTION * g, estimate
        assert r in simulated_rates and guided.summary.slo_attainment >= problem.slo.attainment
        assert any(r < x <= r * (1 + compare.RESOLUTION) * (1 + 1e-9) for x in simulated_rates)  # failed above
        assert len(set(simulated_rates)) < num_plain
        if estimate == g:       # the same probe passes, one step above fails: two probes, the same figures
            assert len(set(simulated_rates)) == 2      # (the miss shares are those of its own failing probe)
            assert (guided.rate_per_s, guided.summary) == (g, plain.summary)
