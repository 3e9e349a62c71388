"""`make_plan`: search, verify in the simulator, and write the answer as a Plan. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trtpd.errors import ConfigError
from trtpd.planner import throughput_ratio
from trtpd.planner import compare, parallel
from trtpd.schema.plan import (ColocatedPlan, Comparison, DecodePlan, Expected, KvTransferPlan, Plan, PrefillPlan,
                               SideSummary, TargetSummary, Verification, WorkloadSummary)
from trtpd.planner.search import Choice, PlanProblem, Planner, SearchResult, plan_search
from trtpd.planner.verify import VerifyOutcome, verify
from trtpd.sim.goodput import num_requests_measuring, settle_span_s
from trtpd.sim.workload import generate_requests


@dataclass(frozen=True)
class VerifyOptions:
    enabled: bool = True
    num_requests: int = 6000
    seed: int = 0
    try_fewer: bool = True
    max_simulations: int = 5
    compare_colocated: bool = True     # also search colocated configurations and recommend one side
    compare_requests: int = 1000       # requests per simulation of a goodput search (more to cover the warm-up)
    parallel: bool = True              # the colocated search in a second process (same answer; planner.parallel)
    decide_early: bool = True          # a trimmed configuration that fails stops once that is certain (verify)


def make_plan(problem: PlanProblem, options: VerifyOptions = VerifyOptions()) -> Plan:
    planner = Planner(problem)
    rate = planner.target_rate_per_s()      # the comparison's target, if any
    budget = problem.space.max_gpus
    comparing = options.enabled and options.compare_colocated and bool(planner.decodes) and \
        not (rate is None and budget is None)
    goodput = compare.Goodput(problem, options.compare_requests, options.seed)

    def colocated() -> tuple[tuple, compare.Chosen] | None:   # picklable: no performance model in it
        candidates = compare.shortlist(planner)
        found = compare.search_colocated(planner, goodput, rate, budget, candidates,
                                         compare.search_order(candidates, rate, budget))
        chosen = compare.confirm_colocated(planner, goodput, rate, budget, candidates, found)
        return None if chosen is None else (compare.candidate_key(candidates[chosen[0]][0]), chosen)

    def disaggregated() -> tuple[Plan, compare.Side | None, SearchResult]:
        result = plan_search(problem, planner)
        verify = options if problem.target is not None else replace(options, try_fewer=False)  # a budget: keep
        choice, verdict = result.choice, None                                                # its GPUs
        if choice is not None:
            choice = _prefer_nvlink(planner, choice)
            if options.enabled and result.rate_per_s is not None and problem.target is None:
                choice, verdict = _verified_budget(problem, result, choice, verify)
            elif options.enabled and result.rate_per_s is not None:
                choice, verdict = _verified(problem, result, choice, result.rate_per_s, verify)
        plan = _to_plan(problem, result, choice, verdict)
        if not comparing or choice is None:
            return plan, None, result
        # the verification's run at the target rate, of the counts it chose, says whether they meet the target
        same_counts = verdict is not None and \
            (verdict.num_prefill, verdict.num_decode) == (choice.num_prefill, choice.num_decode)
        at_target = (verdict.passed, verdict.summary) if same_counts and rate is not None else None
        # the goodput search starts from the verification's passing run of these counts (at the target, or at
        # the budget's analytic rate)
        known = (result.rate_per_s, verdict.run) if same_counts and verdict.passed else None
        return plan, compare.disaggregated_side(planner, choice, goodput, rate, at_target, known), result

    if not comparing:
        return disaggregated()[0]
    # the colocated search needs nothing of the disaggregated side, not even its analytic search: both at once
    # (trtpd.planner.parallel)
    found, (plan, disagg, result) = parallel.both(colocated, disaggregated, options.parallel)
    coloc = None if found is None else compare.colocated_side_of(compare.candidate_of(planner, found[0]), found[1])
    _add_comparison(plan, result, disagg, coloc, rate)
    return plan


def _add_comparison(plan: Plan, result: SearchResult, disagg: compare.Side | None, coloc: compare.Side | None,
                    rate: float | None) -> None:
    """The best colocated configuration beside the disaggregated one, both simulated the same way."""
    answer = compare.decide(disagg, coloc, rate)
    out_tokens = result.stats.output.mean
    plan.comparison = Comparison(recommended=answer.recommended, ratio_per_gpu=min(answer.ratio_per_gpu, 1e9),
                                 reasons=answer.reasons,
                                 disaggregated=_side_summary(disagg, out_tokens) if disagg else None,
                                 colocated=_side_summary(coloc, out_tokens) if coloc else None)
    if coloc is not None and coloc.colocated is not None:
        c = coloc.colocated
        plan.colocated = ColocatedPlan(num_instances=coloc.num_instances["colocated"], tp=c.tp, policy=c.policy,
                                       max_batch_size=c.max_batch_size, max_num_tokens=c.max_num_tokens,
                                       max_input_len=result.max_input_len, max_seq_len=result.max_seq_len,
                                       kv_capacity_tokens=c.inst.kv_capacity_tokens, perf_source=c.inst.source)
    if answer.recommended == "colocated" and coloc is not None and not plan.feasible and \
            (rate is None or coloc.meets_target):
        plan.notes.append(f"disaggregated: {plan.binding_constraint}; colocated {coloc.label} meets the SLOs")
        plan.feasible, plan.binding_constraint, plan.nearest_feasible = True, None, {}


def _side_summary(side: compare.Side, mean_output_tokens: float) -> SideSummary:
    s = side.measured.summary
    return SideSummary(label=side.label, num_gpus=side.num_gpus, tp=side.tp, num_instances=side.num_instances,
                       max_batch_size=side.max_batch_size, max_num_tokens=side.max_num_tokens, policy=side.policy,
                       goodput_rate_per_s=side.measured.rate_per_s, goodput_per_gpu_per_s=side.goodput_per_gpu_per_s,
                       output_tokens_per_s_per_gpu=side.goodput_per_gpu_per_s * mean_output_tokens,
                       static_rate_per_s=side.static_rate_per_s, static_per_gpu_per_s=side.static_per_gpu_per_s,
                       ttft_s=s.ttft_s.as_dict() if s else {}, tpot_s=s.tpot_s.as_dict() if s else {},
                       slo_attainment=(s.slo_attainment or 0.0) if s else 0.0, busy_share=side.busy_shares(),
                       meets_target=side.meets_target, perf_source=side.perf_source)


def _verified(problem: PlanProblem, result: SearchResult, choice: Choice, rate: float,
              options: VerifyOptions) -> tuple[Choice, VerifyOutcome]:
    """Runs the simulator at the target rate; it has the last word on feasibility and counts."""
    planner = result.planner
    assert planner is not None
    space = problem.space
    warmup_s = settle_span_s(result.stats.output.max, problem.slo.tpot_s)   # and the cool-down
    requests = generate_requests(problem.workload, rate, num_requests_measuring(options.num_requests, rate, warmup_s),
                                 options.seed)
    cfg, p = choice.config, problem.slo.attainment

    def analytic_q(counts: tuple[int, int]) -> tuple[float, float]:
        est = cfg.estimate(counts[0], counts[1], rate, problem.slo.ttft_s, problem.slo.tpot_s, p)
        return est.ttft_p_s, est.tpot_p_s

    def propose(counts: tuple[int, int], ttft_c: float, tpot_c: float) -> tuple[int, int] | None:
        n_p, n_d, binding = planner.counts_for_rate(cfg.corrected(ttft_c, tpot_c), rate, choice.link_kind)
        return (n_p, n_d) if binding is None else None

    verdict = verify(cfg.prefill, cfg.decode, (choice.num_prefill, choice.num_decode), cfg.link, requests,
                     problem.slo, space.tokens_per_block, space.first_token_at, analytic_q, propose,
                     lambda c: cfg.is_stable(c[0], c[1], rate), space.max_gpus, options.try_fewer,
                     options.max_simulations, warmup_s, options.decide_early)
    if (verdict.num_prefill, verdict.num_decode) != (choice.num_prefill, choice.num_decode):
        result.notes.append(f"the simulator moved the analytic {choice.num_prefill}P{choice.num_decode}D to "
                            f"{verdict.num_prefill}P{verdict.num_decode}D")
    choice = _calibrated(planner, choice, verdict, rate)
    within_budget = space.max_gpus is None or choice.num_gpus <= space.max_gpus
    if verdict.passed and within_budget and not result.feasible and result.binding_constraint == "gpu_budget":
        result.notes.append(f"the analytic model asked for {result.nearest_feasible.get('num_gpus', 0):.0f} GPUs; "
                            f"the simulator confirms {choice.num_gpus} within the budget")
        result.feasible, result.binding_constraint, result.nearest_feasible = True, None, {}
    elif not verdict.passed:
        if result.feasible:
            result.feasible = False
            result.binding_constraint = "simulation"
            result.notes.append("the simulator could not confirm the SLOs within the adjustments tried")
        result.nearest_feasible["rate_per_s"] = choice.max_rate_per_s
    return choice, verdict


# a budget plan's rate steps down by this share while the simulator does not confirm it, at most this many times
BUDGET_STEP = 1 / 32
BUDGET_STEPS = 3


def _verified_budget(problem: PlanProblem, result: SearchResult, choice: Choice,
                     options: VerifyOptions) -> tuple[Choice, VerifyOutcome]:
    """A budget: the analytic highest rate of these GPUs, verified; while the simulator does not confirm it,
    the rate steps down by BUDGET_STEP and is verified again, so that the plan's rate is one the simulator
    passed (the analytic rate is an estimate at the edge of the SLOs; a simulation there passes or fails by
    a share of a percent)."""
    analytic = rate = result.rate_per_s
    assert rate is not None
    for step in range(BUDGET_STEPS + 1):
        tried = replace(result, notes=list(result.notes), nearest_feasible=dict(result.nearest_feasible))
        verified, verdict = _verified(problem, tried, choice, rate, options)
        if verdict.passed or step == BUDGET_STEPS:
            break
        rate *= 1 - BUDGET_STEP
    result.rate_per_s, result.feasible, result.binding_constraint = rate, tried.feasible, tried.binding_constraint
    result.notes[:], result.nearest_feasible = tried.notes, tried.nearest_feasible
    if verdict.passed and rate < analytic:
        result.notes.append(f"the simulator confirms {rate:.3g} requests/s with these GPUs, not the analytic "
                            f"{analytic:.3g}")
    return verified, verdict


def _calibrated(planner: Planner, choice: Choice, verdict: VerifyOutcome, rate: float) -> Choice:
    """Scales the analytic TTFT_p and TPOT_p to what the simulator measured at the verified counts,
    so that the plan's expected values and max_rate_per_s agree with the simulation."""
    raw = planner.choice(choice.config.corrected(1.0, 1.0), verdict.num_prefill, verdict.num_decode, rate,
                         choice.link_kind).estimate
    ttft_c = verdict.ttft_q_s / raw.ttft_p_s if raw.ttft_p_s > 0 and verdict.ttft_q_s < float("inf") else 1.0
    tpot_c = verdict.tpot_q_s / raw.tpot_p_s if raw.tpot_p_s > 0 and verdict.tpot_q_s > 0 else 1.0
    cfg = choice.config.corrected(ttft_c, tpot_c)
    return planner.choice(cfg, verdict.num_prefill, verdict.num_decode, rate, choice.link_kind)


def _prefer_nvlink(planner: Planner, choice: Choice) -> Choice:
    """kv_link auto: when the whole plan fits in one node, KV moves over NVLink."""
    hw = planner.problem.hardware
    if (planner.problem.space.kv_link != "auto" or hw.nvlink_bandwidth_bytes_per_s <= 0
            or choice.num_gpus > hw.max_devices_per_node):
        return choice
    cfg = planner.config(choice.config.prefill, choice.config.decode, "nvlink")
    rate = choice.estimate.rate_per_s
    return planner.choice(cfg, choice.num_prefill, choice.num_decode, rate, "nvlink")


def _seed004_first_pass(problem: PlanProblem, result: SearchResult, choice: Choice) -> dict[str, float]:
    """Seed 004's method on the same performance curves and the chosen TP degrees."""
    cp, cd = choice.config.prefill, choice.config.decode
    l_in, l_out = result.stats.input.mean, result.stats.output.mean
    tp_prefill_max = cp.model.max_num_tokens / cp.model.batch_s(cp.model.max_num_tokens)
    overhead_s = choice.config.decode_side_ttft_s(1e-6, problem.slo.attainment)
    out: dict[str, float] = {"tp_prefill_max_tokens_per_s": tp_prefill_max, "overhead_s": overhead_s}
    try:
        tp_prefill = throughput_ratio.prefill_throughput_under_ttft(tp_prefill_max, l_in, problem.slo.ttft_s, overhead_s)
    except ConfigError:   # the seed's method has no answer here (TTFT too tight); say so in the plan
        out["infeasible"] = 1.0
        return out
    batch = cd.max_batch_size
    tp_decode = throughput_ratio.decode_throughput(batch, cd.model.step_s(batch))
    total_tokens_per_s = (result.rate_per_s or choice.max_rate_per_s) * (l_in + l_out)
    counts = throughput_ratio.instance_counts(total_tokens_per_s, l_in, l_out, tp_prefill, tp_decode)
    out.update(tp_prefill_tokens_per_s=tp_prefill, tp_decode_tokens_per_s=tp_decode, decode_batch=float(batch),
               pd_ratio=throughput_ratio.pd_ratio(l_in, l_out, tp_prefill, tp_decode),
               num_prefill=float(counts.num_prefill), num_decode=float(counts.num_decode),
               max_tokens_per_min=counts.max_tokens_per_min)
    return out


def _to_plan(problem: PlanProblem, result: SearchResult, choice: Choice | None, verdict: VerifyOutcome | None) -> Plan:
    s, space, wl = result.stats, problem.space, problem.workload
    rate = result.rate_per_s
    plan = Plan(
        model=problem.model.name, hardware=problem.hardware.name, weight_dtype=space.weight_dtype,
        kv_dtype=space.kv_dtype, tokens_per_block=space.tokens_per_block, first_token_at=space.first_token_at,
        feasible=result.feasible, binding_constraint=result.binding_constraint,
        nearest_feasible=result.nearest_feasible,
        target=TargetSummary(rate_per_s=rate, tokens_per_min=rate * s.mean_tokens_per_request * 60 if rate else None),
        slo=problem.slo,
        workload=WorkloadSummary(name=wl.name, mean_input_tokens=s.input.mean, p99_input_tokens=s.input.p99,
                                 max_input_tokens=result.max_input_len, mean_output_tokens=s.output.mean,
                                 max_output_tokens=int(s.output.max), arrival_process=wl.arrival.process,
                                 arrival_cv=wl.arrival_cv),
        rejected=[f"{r.role} tp={r.tp}: {r.reason}" for r in result.rejected],
        notes=list(result.notes))
    if choice is None:
        return plan
    cp, cd, link, est = choice.config.prefill, choice.config.decode, choice.config.link, choice.estimate
    sched = cp.scheduler
    plan.prefill = PrefillPlan(
        num_instances=choice.num_prefill, tp=cp.tp, max_batch_size=sched.max_batch_size,
        max_num_tokens=sched.max_num_tokens, max_input_len=result.max_input_len,
        max_seq_len=result.max_input_len + 1, bucket_boundaries_tokens=list(sched.bucket_boundaries_tokens),
        bucket_timeout_s=sched.bucket_timeout_s, min_batch_size=sched.min_batch_size,
        kv_capacity_tokens=cp.inst.kv_capacity_tokens, perf_source=cp.inst.source)
    plan.decode = DecodePlan(
        num_instances=choice.num_decode, tp=cd.tp, max_batch_size=cd.max_batch_size,
        max_num_tokens=cd.max_batch_size, max_input_len=result.max_input_len, max_seq_len=result.max_seq_len,
        kv_capacity_tokens=cd.inst.kv_capacity_tokens, perf_source=cd.inst.source)
    rate_d = (rate or choice.max_rate_per_s) / choice.num_decode
    plan.kv_transfer = KvTransferPlan(
        link=choice.link_kind, link_bandwidth_bytes_per_s=link.bytes_per_s,
        required_bandwidth_bytes_per_s=link.required_bytes_per_s(rate_d),
        link_utilization=rate_d * link.transfer_s(s.input.mean), kv_bytes_per_token=link.kv_bytes_per_token,
        mean_bytes_per_request=s.input.mean * link.kv_bytes_per_token, mean_transfer_s=link.transfer_s(s.input.mean))
    plan.num_gpus = choice.num_gpus
    plan.max_rate_per_s = choice.max_rate_per_s
    plan.goodput_per_gpu_per_s = choice.goodput_per_gpu_per_s
    plan.expected = Expected(ttft_p_s=est.ttft_p_s, tpot_p_s=est.tpot_p_s, decode_batch_mean=est.decode_batch_mean,
                             prefill_utilization=est.prefill_utilization,
                             ttft_correction=choice.config.ttft_correction,
                             tpot_correction=choice.config.tpot_correction)
    if verdict is not None:
        sm = verdict.summary
        b = sm.ttft_breakdown
        plan.verification = Verification(
            num_requests=sm.num_requests, rate_per_s=rate or 0.0, ttft_s=sm.ttft_s.as_dict(),
            tpot_s=sm.tpot_s.as_dict(), slo_attainment=sm.slo_attainment or 0.0, passed=verdict.passed,
            ttft_breakdown_s={} if b is None else {
                "prefill_queue": b.prefill_queue_s, "prefill_compute": b.prefill_compute_s,
                "decode_queue": b.decode_queue_s, "kv_transfer": b.kv_transfer_s},
            simulations=[[float(p), float(d), a] for p, d, a in verdict.history])
    plan.seed004 = _seed004_first_pass(problem, result, choice)
    return plan
